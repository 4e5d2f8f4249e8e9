//! The line a `tessel` daemon prints on stdout once it serves: one JSON
//! object, the only thing launchers, benchmarks and tests read from it.

use std::io::Write;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// What became ready, with the addresses it bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ready", rename_all = "snake_case")]
pub enum Ready {
    /// A replica serves at `listen` (with `--join`: it is a member).
    Coordinator {
        /// The replica's id.
        id: u64,
        /// Where it serves.
        listen: SocketAddr,
        /// Where its metrics are served, if anywhere.
        metrics: Option<SocketAddr>,
    },
    /// A coordinator on etcd (`--kv`): its monitor and scheduler run.
    Attached {
        /// The etcd endpoints.
        kv: String,
        /// Where its metrics are served, if anywhere.
        metrics: Option<SocketAddr>,
    },
    /// A worker registered; `again` after a lost registration.
    Worker {
        /// The worker's id.
        worker: String,
        /// Its incarnation.
        incarnation: u64,
        /// Whether it registered before in this process.
        again: bool,
        /// Loading the plugin and probing its devices.
        plugin_ms: u64,
        /// When the plugin was ready (unix ms).
        plugin_ready_unix_ms: u64,
        /// Where its metrics are served, if anywhere.
        metrics: Option<SocketAddr>,
    },
}

impl Ready {
    /// Prints the line and flushes stdout.
    pub fn announce(&self) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", serde_json::to_string(self).expect("encodes"));
        let _ = out.flush();
    }

    /// The readiness in `line`, if it is one.
    pub fn parse(line: &str) -> Option<Ready> {
        serde_json::from_str(line.trim()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_lines_round_trip_and_prose_is_not_one() {
        let r = Ready::Coordinator {
            id: 2,
            listen: "127.0.0.1:7000".parse().unwrap(),
            metrics: None,
        };
        let line = serde_json::to_string(&r).unwrap();
        assert_eq!(
            line,
            r#"{"ready":"coordinator","id":2,"listen":"127.0.0.1:7000","metrics":null}"#
        );
        assert_eq!(Ready::parse(&line), Some(r));
        assert_eq!(Ready::parse("replica 2 listening on 127.0.0.1:7000"), None);
    }
}
