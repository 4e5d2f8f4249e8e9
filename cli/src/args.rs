//! Arguments several commands share: where the cluster is, its TLS
//! folder, the plugin.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use tessel::pjrt::{locate, Plugin};
use tessel_kv::KvStore;
use tessel_kv_service::raft::client::RaftKv;
use tessel_tls::TlsFiles;

use crate::exit::Exit;
use crate::target_env::EnvTarget;

/// Where to find the TLS folder, or `--insecure`.
#[derive(Args, Clone)]
pub(crate) struct TlsArgs {
    /// Folder with ca.pem, node.pem and node.key (from `tessel certs init`).
    #[arg(long, value_name = "DIR", conflicts_with = "insecure")]
    pub tls_dir: Option<PathBuf>,
    /// The CA bundle to trust instead of the folder's ca.pem (a trust
    /// bundle with the old and the new CA while a CA rotates; followed on
    /// disk like the folder).
    #[arg(long, value_name = "FILE", requires = "tls_dir")]
    pub tls_ca: Option<PathBuf>,
    /// Run without TLS authentication (tests and local experiments only).
    #[arg(long)]
    pub insecure: bool,
}

impl TlsArgs {
    /// The loaded certificates, `None` for `--insecure`; neither is an error.
    /// Without `--tls-dir` or `--insecure`, the environment's
    /// (`TESSEL_TLS_DIR`, `TESSEL_INSECURE`), else the active context's
    /// (`tessel context`).
    pub(crate) fn load(&self) -> Result<Option<TlsFiles>> {
        if let Some(dir) = &self.tls_dir {
            // A folder that cannot be read is the caller's input (exit 2).
            return TlsFiles::load_trusting(dir, self.tls_ca.as_deref())
                .map(Some)
                .map_err(|e| Exit::bad_input(e).into());
        }
        if self.insecure {
            return Ok(None);
        }
        let from = |tls_dir, tls_ca, insecure| {
            TlsArgs {
                tls_dir,
                tls_ca,
                insecure,
            }
            .load()
        };
        let env = EnvTarget::read().map_err(Exit::bad_input)?;
        if env.tls_dir.is_some() || env.insecure {
            return from(env.tls_dir, env.tls_ca, env.insecure);
        }
        match crate::context::active()? {
            Some((_, ctx)) if ctx.tls_dir.is_some() || ctx.insecure => {
                from(ctx.tls_dir, ctx.tls_ca, ctx.insecure)
            }
            _ => Err(Exit::bad_input("give --tls-dir DIR (see `tessel certs init`) or --insecure, set TESSEL_TLS_DIR, or set a context (`tessel context set`)").into()),
        }
    }
}

/// A list of `HOST:PORT` endpoints, checked for form when parsed and
/// resolved when used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Endpoints(pub Vec<String>);

impl Endpoints {
    /// `HOST:PORT[,HOST:PORT..]` (a clap value parser).
    pub(crate) fn parse(list: &str) -> Result<Endpoints, String> {
        let all: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if all.is_empty() {
            return Err(format!("`{list}` names no HOST:PORT"));
        }
        for e in &all {
            let port = e.rsplit_once(':').map(|(_, p)| p);
            if port.and_then(|p| p.parse::<u16>().ok()).is_none() {
                return Err(format!("`{e}` is not HOST:PORT"));
            }
        }
        Ok(Endpoints(all))
    }

    /// `etcd://HOST:PORT[,HOST:PORT..]` (a clap value parser).
    pub(crate) fn parse_etcd(url: &str) -> Result<Endpoints, String> {
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| format!("`{url}`: expected etcd://HOST:PORT[,HOST:PORT..]"))?;
        Endpoints::parse(rest)
    }

    /// A client of the replicas these name: names are looked up now (one
    /// must resolve) and again when a replica moves.
    pub(crate) async fn client(&self, tls: Option<&TlsFiles>) -> Result<RaftKv> {
        RaftKv::connect_named(&self.0, tls)
            .await
            .with_context(|| format!("coordinators {self}"))
    }

    /// The first endpoint.
    pub(crate) fn first(&self) -> &str {
        &self.0[0]
    }
}

impl std::fmt::Display for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

/// Which key-value service to talk to: tessel's replicas or etcd.
#[derive(Args, Clone)]
pub(crate) struct KvTargetArgs {
    /// tessel coordinator (replica) addresses, comma separated.
    /// Default: $TESSEL_COORDINATOR, else the active context's (`tessel
    /// context`).
    #[arg(long, value_name = "ADDR[,ADDR..]")]
    pub coordinator: Option<String>,
    /// An etcd cluster instead: `etcd://HOST:PORT[,HOST:PORT..]` (needs a
    /// tessel built with `--features etcd`).
    #[arg(long, value_name = "URL", conflicts_with = "coordinator")]
    pub kv: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// The service `--coordinator` or `--kv` named, parsed once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KvService {
    Replicas(Endpoints),
    Etcd(Endpoints),
}

impl KvService {
    /// The endpoints, whichever the service.
    pub(crate) fn endpoints(&self) -> &Endpoints {
        match self {
            KvService::Replicas(e) | KvService::Etcd(e) => e,
        }
    }
}

impl std::fmt::Display for KvService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvService::Replicas(e) => write!(f, "{e}"),
            KvService::Etcd(e) => write!(f, "etcd://{e}"),
        }
    }
}

impl KvTargetArgs {
    /// The service named, its addresses checked for form.
    pub(crate) fn service(&self) -> Result<KvService> {
        let with = |coordinator, kv| {
            KvTargetArgs {
                coordinator,
                kv,
                tls: self.tls.clone(),
            }
            .service()
        };
        let parsed = match (&self.kv, &self.coordinator) {
            (Some(url), _) => Endpoints::parse_etcd(url).map(KvService::Etcd),
            (None, Some(list)) => Endpoints::parse(list).map(KvService::Replicas),
            (None, None) => {
                let env = EnvTarget::read().map_err(Exit::bad_input)?;
                if env.coordinator.is_some() || env.kv.is_some() {
                    return with(env.coordinator, env.kv);
                }
                return match crate::context::active()? {
                    Some((_, ctx)) if ctx.coordinator.is_some() || ctx.kv.is_some() => {
                        with(ctx.coordinator, ctx.kv)
                    }
                    _ => Err(Exit::bad_input("give --coordinator ADDRS or --kv etcd://…, set TESSEL_COORDINATOR, or set a context (`tessel context set`)").into()),
                };
            }
        };
        parsed.map_err(|e| Exit::bad_input(e).into())
    }

    /// A client of the chosen service.
    pub(crate) async fn connect(&self) -> Result<Box<dyn KvStore>> {
        match self.service()? {
            KvService::Etcd(etcd) => connect_etcd(&etcd).await,
            KvService::Replicas(list) => {
                Ok(Box::new(list.client(self.tls.load()?.as_ref()).await?))
            }
        }
    }
}

#[cfg(feature = "etcd")]
pub(crate) async fn connect_etcd(etcd: &Endpoints) -> Result<Box<dyn KvStore>> {
    use tessel_kv_service::etcd::{EtcdKv, EtcdOptions};
    let urls: Vec<String> = etcd.0.iter().map(|e| format!("http://{e}")).collect();
    let kv = EtcdKv::connect(&urls, EtcdOptions::default())
        .await
        .with_context(|| format!("connecting to etcd://{etcd}"))?;
    Ok(Box::new(kv))
}

#[cfg(not(feature = "etcd"))]
pub(crate) async fn connect_etcd(etcd: &Endpoints) -> Result<Box<dyn KvStore>> {
    anyhow::bail!("`--kv etcd://{etcd}`: this tessel was built without etcd support; rebuild with `cargo build --features etcd`")
}

/// `--plugin NAME|PATH`, one declaration for every command that loads one.
#[derive(Args, Clone, Debug, Default)]
pub(crate) struct PluginArg {
    /// A plugin name (cpu, cuda, cpu-lammps, cpu-fastatomstruct) or the path
    /// of a PJRT plugin library. Default: $TESSEL_PJRT_PLUGIN, else cpu.
    #[arg(long, value_name = "NAME|PATH")]
    pub plugin: Option<String>,
    /// A create option of the plugin's clients, typed as the plugin checks
    /// it: `memory_fraction=0.8` (a float), `preallocate=false`,
    /// `visible_devices=[0,1]`, `allocator=platform`; repeat for several.
    #[arg(long = "plugin-option", value_name = "NAME=VALUE")]
    pub plugin_option: Vec<String>,
}

impl PluginArg {
    /// The name as given (or from the environment, else `cpu`).
    pub(crate) fn name(&self) -> String {
        self.plugin
            .clone()
            .or_else(|| {
                std::env::var(locate::PLUGIN_ENV)
                    .ok()
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "cpu".into())
    }

    /// The plugin library's path.
    pub(crate) fn path(&self) -> Result<PathBuf> {
        Ok(locate::resolve(self.plugin.as_deref())?)
    }

    pub(crate) fn load(&self) -> Result<Plugin> {
        Ok(Plugin::load(&self.path()?)?)
    }

    /// The `--plugin-option`s, typed; `num_nodes` and `node_id` only with
    /// `nodes` (`tessel run`, where no worker sets them).
    pub(crate) fn options_with(&self, nodes: bool) -> Result<Vec<tessel::pjrt::NamedValue>> {
        self.plugin_option
            .iter()
            .map(|o| {
                let (name, value) = o
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--plugin-option `{o}`: expected NAME=VALUE"))?;
                if !(nodes && ["num_nodes", "node_id"].contains(&name)) {
                    tessel::job::check_plugin_option_name(name)
                        .map_err(|e| anyhow::anyhow!("--plugin-option `{o}`: {e}"))?;
                }
                let v = tessel::job::PluginOption::parse(value)
                    .map_err(|e| anyhow::anyhow!("--plugin-option `{o}`: {e}"))?;
                Ok(tessel::pjrt::NamedValue::new(name, v.to_value()))
            })
            .collect()
    }

    /// The `--plugin-option`s of a worker's clients, typed.
    pub(crate) fn options(&self) -> Result<Vec<tessel::pjrt::NamedValue>> {
        self.options_with(false)
    }

    /// The options as `tessel worker` arguments.
    pub(crate) fn option_args(&self) -> Vec<String> {
        self.plugin_option
            .iter()
            .flat_map(|o| ["--plugin-option".to_owned(), o.clone()])
            .collect()
    }
}
