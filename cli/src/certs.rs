//! `tessel certs init|issue`.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;
use tessel_tls::init_certs;

#[derive(Subcommand)]
pub(crate) enum CertsCommand {
    /// Create a cluster CA (ca.pem, ca.key) and, unless --ca-only, one
    /// certificate every node shares (node.pem, node.key: for tests and
    /// local experiments; a cluster issues one per node with `issue`).
    Init {
        dir: PathBuf,
        /// Host names and IPs the shared certificate is valid for, comma
        /// separated.
        #[arg(long, value_delimiter = ',', conflicts_with = "ca_only")]
        hosts: Vec<String>,
        /// Only the CA.
        #[arg(long)]
        ca_only: bool,
    },
    /// Sign a certificate for one coordinator, worker or client with the
    /// CA in CA_DIR, and write the node's TLS folder (ca.pem, node.pem,
    /// node.key; never ca.key) to --out.
    Issue {
        /// The folder with ca.pem and ca.key.
        ca_dir: PathBuf,
        /// coordinator, worker or client.
        #[arg(long, value_parser = parse_role)]
        role: tessel_tls::Role,
        /// The node's name: a coordinator's replica id, a worker's id, a
        /// client's user name.
        #[arg(long)]
        name: String,
        /// Host names and IPs the node serves at, comma separated (a
        /// coordinator: every address clients and peers dial; `*.` DNS
        /// wildcards allowed).
        #[arg(long, value_delimiter = ',')]
        hosts: Vec<String>,
        /// The folder to write.
        #[arg(long)]
        out: PathBuf,
        /// How long the certificate is valid, in days.
        #[arg(long, default_value_t = tessel_tls::NODE_DAYS, value_parser = clap::value_parser!(u32).range(1..=36500))]
        days: u32,
        /// Replace the certificate in an existing folder instead (a process
        /// using the folder adopts it within seconds, without a restart).
        #[arg(long)]
        renew: bool,
        /// With --renew: a new key too (else the folder's key is kept).
        #[arg(long, requires = "renew")]
        new_key: bool,
        /// With --renew: the CA bundle the node trusts from now on (a CA
        /// rotation: old and new CA, later the new one alone).
        #[arg(long, requires = "renew")]
        trust: Option<PathBuf>,
    },
}

fn parse_role(s: &str) -> Result<tessel_tls::Role, String> {
    tessel_tls::Role::parse(s)
        .ok_or_else(|| format!("`{s}`: expected coordinator, worker or client"))
}

pub(crate) fn certs(cmd: CertsCommand) -> Result<()> {
    match cmd {
        CertsCommand::Init {
            dir, ca_only: true, ..
        } => {
            tessel_tls::init_ca(&dir)?;
            println!(
                "created the cluster CA in {} (ca.key signs every node's certificate: keep it on this host)",
                dir.display()
            );
            Ok(())
        }
        CertsCommand::Init { dir, hosts, .. } => {
            init_certs(&dir, &hosts)?;
            println!(
                "created the cluster CA and one certificate every node shares in {}",
                dir.display()
            );
            eprintln!(
                "warning: node.pem serves every coordinator, worker and client alike; for a cluster, issue one per node with `tessel certs issue`"
            );
            Ok(())
        }
        CertsCommand::Issue {
            ca_dir,
            role,
            name,
            hosts,
            out,
            days,
            renew,
            new_key,
            trust,
        } => {
            let node = tessel_tls::NodeCert {
                role,
                name: &name,
                hosts: &hosts,
                valid: tessel_tls::Validity::days(days),
            };
            if renew {
                tessel_tls::renew(&ca_dir, &node, &out, new_key, trust.as_deref())?;
                println!(
                    "renewed {role} `{name}`'s certificate in {} for {days} days{}",
                    out.display(),
                    if new_key { ", with a new key" } else { "" }
                );
            } else {
                tessel_tls::issue(&ca_dir, &node, &out)?;
                println!(
                    "issued {role} `{name}`'s certificate into {} (ca.pem, node.pem, node.key), valid {days} days",
                    out.display()
                );
            }
            Ok(())
        }
    }
}
