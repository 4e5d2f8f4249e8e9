//! `tessel context`: named clusters a person or a CI job talks to, each
//! with its coordinators and its TLS folder, like kubeconfig's contexts.
//! A command given no `--coordinator`/`--kv` and no `--tls-dir`/`--insecure`
//! takes them from the context `$TESSEL_CONTEXT` names, else from the
//! current one.
//!
//! The file: `$TESSEL_CONFIG`, else `$XDG_CONFIG_HOME/tessel/config.toml`,
//! else `~/.config/tessel/config.toml`. It holds paths, never keys.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use clap::Subcommand;
use serde::{Deserialize, Serialize};

use crate::exit::Exit;

/// One cluster as seen by its user.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Ctx {
    /// `--coordinator`'s value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator: Option<String>,
    /// `--kv`'s value (etcd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv: Option<String>,
    /// `--tls-dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_dir: Option<PathBuf>,
    /// `--tls-ca`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<PathBuf>,
    /// `--insecure`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
}

/// The whole file.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    current: Option<String>,
    #[serde(default)]
    contexts: BTreeMap<String, Ctx>,
}

fn path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("TESSEL_CONFIG") {
        return Ok(PathBuf::from(p));
    }
    let base = match std::env::var_os("XDG_CONFIG_HOME") {
        Some(x) if !x.is_empty() => PathBuf::from(x),
        _ => PathBuf::from(
            std::env::var_os("HOME")
                .context("no $HOME: set TESSEL_CONFIG to the file that holds tessel's contexts")?,
        )
        .join(".config"),
    };
    Ok(base.join("tessel").join("config.toml"))
}

fn read(path: &Path) -> Result<Config> {
    match std::fs::read_to_string(path) {
        Ok(text) => toml::from_str(&text).with_context(|| format!("{}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn write(path: &Path, c: &Config) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, toml::to_string(c)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// The context a command falls back on: `$TESSEL_CONTEXT`'s, else the
/// current one; `None` when there is none (not an error: the flags decide).
pub(crate) fn active() -> Result<Option<(String, Ctx)>> {
    let p = path()?;
    let c = read(&p)?;
    let name = match std::env::var("TESSEL_CONTEXT") {
        Ok(n) if !n.is_empty() => n,
        _ => match c.current {
            Some(n) => n,
            None => return Ok(None),
        },
    };
    match c.contexts.get(&name) {
        Some(ctx) => Ok(Some((name, ctx.clone()))),
        None => Err(Exit::bad_input(format!(
            "context `{name}` is not in {} (`tessel context list`)",
            p.display()
        ))
        .into()),
    }
}

#[derive(Subcommand)]
pub(crate) enum ContextCommand {
    /// Add or replace a context (and make it current if none is).
    Set {
        /// Its name.
        name: String,
        /// tessel coordinator addresses, comma separated.
        #[arg(long, value_name = "ADDR[,ADDR..]", required_unless_present = "kv")]
        coordinator: Option<String>,
        /// An etcd cluster instead: etcd://HOST:PORT[,..].
        #[arg(long, conflicts_with = "coordinator")]
        kv: Option<String>,
        /// Your TLS folder (ca.pem, node.pem, node.key; e.g. from `tessel
        /// certs issue --role client`, or your client Certificate's Secret).
        #[arg(long, value_name = "DIR", required_unless_present = "insecure")]
        tls_dir: Option<PathBuf>,
        /// A CA bundle to trust instead of the folder's ca.pem.
        #[arg(long, value_name = "FILE", requires = "tls_dir")]
        tls_ca: Option<PathBuf>,
        /// No TLS (local experiments only).
        #[arg(long, conflicts_with = "tls_dir")]
        insecure: bool,
    },
    /// Make a context the current one.
    Use {
        /// Its name.
        name: String,
    },
    /// List the contexts (`*` marks the current one).
    List,
    /// Remove a context.
    Delete {
        /// Its name.
        name: String,
    },
}

pub(crate) fn context(cmd: ContextCommand) -> Result<()> {
    let p = path()?;
    let mut c = read(&p)?;
    match cmd {
        ContextCommand::Set {
            name,
            coordinator,
            kv,
            tls_dir,
            tls_ca,
            insecure,
        } => {
            tessel_kv::check_path_component("context name", &name).map_err(Exit::bad_input)?;
            if let Some(list) = &coordinator {
                crate::args::Endpoints::parse(list).map_err(Exit::bad_input)?;
            }
            if let Some(url) = &kv {
                crate::args::Endpoints::parse_etcd(url).map_err(Exit::bad_input)?;
            }
            // The folder must load now: a context that cannot connect is
            // refused here rather than at its first use.
            let tls_dir = tls_dir.map(|d| std::path::absolute(&d).unwrap_or(d));
            let tls_ca = tls_ca.map(|f| std::path::absolute(&f).unwrap_or(f));
            if let Some(dir) = &tls_dir {
                let tls = tessel_tls::TlsFiles::load_trusting(dir, tls_ca.as_deref())
                    .map_err(Exit::bad_input)?;
                println!(
                    "context `{name}`: you are {}, until {}",
                    tls.identity(),
                    tessel_tls::show_time(tls.not_after())
                );
            }
            c.contexts.insert(
                name.clone(),
                Ctx {
                    coordinator,
                    kv,
                    tls_dir,
                    tls_ca,
                    insecure,
                },
            );
            if c.current.is_none() {
                c.current = Some(name.clone());
            }
            write(&p, &c)?;
            println!("saved context `{name}` in {}", p.display());
        }
        ContextCommand::Use { name } => {
            if !c.contexts.contains_key(&name) {
                return Err(Exit::bad_input(format!(
                    "no context `{name}` in {} (`tessel context list`)",
                    p.display()
                ))
                .into());
            }
            c.current = Some(name.clone());
            write(&p, &c)?;
            println!("current context: `{name}`");
        }
        ContextCommand::List => {
            for (name, ctx) in &c.contexts {
                let mark = if c.current.as_deref() == Some(name) {
                    "*"
                } else {
                    " "
                };
                let target = ctx
                    .coordinator
                    .clone()
                    .or_else(|| ctx.kv.clone())
                    .unwrap_or_default();
                let tls = match (&ctx.tls_dir, ctx.insecure) {
                    (Some(d), _) => d.display().to_string(),
                    (None, true) => "--insecure".into(),
                    (None, false) => String::new(),
                };
                println!("{mark} {name:<16} {target}  {tls}");
            }
        }
        ContextCommand::Delete { name } => {
            if c.contexts.remove(&name).is_none() {
                return Err(
                    Exit::bad_input(format!("no context `{name}` in {}", p.display())).into(),
                );
            }
            if c.current.as_deref() == Some(&name) {
                c.current = None;
            }
            write(&p, &c)?;
            println!("deleted context `{name}`");
        }
    }
    Ok(())
}
