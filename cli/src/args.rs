//! Arguments several commands share: where the cluster is, its TLS
//! folder, the plugin.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use tessel::pjrt::{locate, Plugin};
use tessel_kv::KvStore;
use tessel_kvstore::raft::client::RaftKv;
use tessel_net::tls::TlsFiles;

/// Where to find the TLS folder, or `--insecure`.
#[derive(Args, Clone)]
pub struct TlsArgs {
    /// Folder with ca.pem, node.pem and node.key (from `tessel certs init`).
    #[arg(long, value_name = "DIR", conflicts_with = "insecure")]
    pub tls_dir: Option<PathBuf>,
    /// Run without TLS authentication (tests and local experiments only).
    #[arg(long)]
    pub insecure: bool,
}

impl TlsArgs {
    /// The loaded certificates, `None` for `--insecure`; neither is an error.
    pub fn load(&self) -> Result<Option<TlsFiles>> {
        match (&self.tls_dir, self.insecure) {
            (Some(dir), _) => Ok(Some(TlsFiles::load(dir)?)),
            (None, true) => Ok(None),
            (None, false) => bail!("give --tls-dir DIR (see `tessel certs init`) or --insecure"),
        }
    }
}

/// `HOST:PORT`, resolved now.
pub fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.trim()
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {addr}"))?
        .next()
        .with_context(|| format!("{addr} resolves to nothing"))
}

pub fn coordinators(list: &str) -> Result<Vec<SocketAddr>> {
    list.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(resolve)
        .collect()
}

/// Which key-value service to talk to: tessel's replicas or etcd.
#[derive(Args, Clone)]
pub struct KvTargetArgs {
    /// tessel coordinator (replica) addresses, comma separated.
    #[arg(long, value_name = "ADDR[,ADDR..]", required_unless_present = "kv")]
    pub coordinator: Option<String>,
    /// An etcd cluster instead: `etcd://HOST:PORT[,HOST:PORT..]` (needs a
    /// tessel built with `--features etcd`).
    #[arg(long, value_name = "URL", conflicts_with = "coordinator")]
    pub kv: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

impl KvTargetArgs {
    /// The service, for messages.
    pub fn describe(&self) -> String {
        match (&self.coordinator, &self.kv) {
            (_, Some(url)) => url.clone(),
            (Some(list), None) => list.clone(),
            (None, None) => "none given".into(),
        }
    }

    /// A client of the chosen service.
    pub async fn connect(&self) -> Result<Box<dyn KvStore>> {
        if let Some(url) = &self.kv {
            return connect_etcd(url).await;
        }
        let addrs = self.coordinator.as_deref().unwrap_or_default();
        Ok(Box::new(RaftKv::connect(
            coordinators(addrs)?,
            self.tls.load()?.as_ref(),
        )?))
    }
}

#[cfg(feature = "etcd")]
pub async fn connect_etcd(url: &str) -> Result<Box<dyn KvStore>> {
    use tessel_kvstore::etcd::{parse_url, EtcdKv, EtcdOptions};
    let endpoints = parse_url(url)?;
    let kv = EtcdKv::connect(&endpoints, EtcdOptions::default())
        .await
        .with_context(|| format!("connecting to {url}"))?;
    Ok(Box::new(kv))
}

#[cfg(not(feature = "etcd"))]
pub async fn connect_etcd(url: &str) -> Result<Box<dyn KvStore>> {
    bail!("`--kv {url}`: this tessel was built without etcd support; rebuild with `cargo build --features etcd`")
}

/// `--plugin NAME|PATH`, one declaration for every command that loads one.
#[derive(Args, Clone, Debug, Default)]
pub struct PluginArg {
    /// A plugin name (cpu, cuda, cpu-lammps, cpu-fastatomstruct) or the path
    /// of a PJRT plugin library. Default: $TESSEL_PJRT_PLUGIN, else cpu.
    #[arg(long, value_name = "NAME|PATH")]
    pub plugin: Option<String>,
}

impl PluginArg {
    /// The name as given (or from the environment, else `cpu`).
    pub fn name(&self) -> String {
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
    pub fn path(&self) -> Result<PathBuf> {
        Ok(locate::resolve(self.plugin.as_deref())?)
    }

    pub fn load(&self) -> Result<Plugin> {
        Ok(Plugin::load(&self.path()?)?)
    }
}
