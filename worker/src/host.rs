//! Facts about this host that topologies and the registry record.

/// Hostname and boot id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// The host's name.
    pub hostname: String,
    /// Equal for every process of one boot of one machine; distinguishes
    /// hosts that share a hostname and reboots of one host.
    pub boot_id: String,
}

impl HostFacts {
    /// Reads `/proc/sys/kernel/{hostname,random/boot_id}`;
    /// `TESSEL_BOOT_ID` overrides the boot id (to simulate hosts in tests).
    pub fn read() -> HostFacts {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_owned())
                .unwrap_or_default()
        };
        let hostname = read("/proc/sys/kernel/hostname");
        let boot_id = std::env::var("TESSEL_BOOT_ID")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| read("/proc/sys/kernel/random/boot_id"));
        HostFacts {
            hostname: if hostname.is_empty() {
                "localhost".into()
            } else {
                hostname
            },
            boot_id,
        }
    }
}
