//! Facts about this host that topologies and the registry record.

/// Hostname and boot id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// The host's name.
    pub hostname: String,
    /// Equal for every process of one boot of one machine that shares its
    /// `/dev/shm`; distinguishes hosts that share a hostname, reboots of
    /// one host, and containers of one host (each has its own `/dev/shm`,
    /// so shared memory between them is not an option).
    pub boot_id: String,
}

impl HostFacts {
    /// Reads `/proc/sys/kernel/{hostname,random/boot_id}` and the device
    /// of `/dev/shm` (`BOOT/shm-DEV`); `TESSEL_BOOT_ID` overrides the boot
    /// id (to simulate hosts in tests).
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
            .unwrap_or_else(|| {
                use std::os::unix::fs::MetadataExt;
                let shm = std::fs::metadata("/dev/shm").map_or(0, |m| m.dev());
                format!("{}/shm-{shm:x}", read("/proc/sys/kernel/random/boot_id"))
            });
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
