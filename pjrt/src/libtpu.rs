//! The environment libtpu needs to stay off the network.
//!
//! Loading libtpu without `TPU_SKIP_MDS_QUERY` makes it ask a cloud's
//! metadata server for its slice (30 retries a key) before it fails: on any
//! machine outside that cloud a load hangs for minutes. Every load of libtpu
//! goes through [`crate::Plugin::load`], which sets these variables first
//! unless the user set them: this is the one place tessel decides them.

use std::path::Path;

/// Variables set before libtpu is loaded, each only when unset.
pub const QUIET_ENV: &[(&str, &str)] = &[("TPU_SKIP_MDS_QUERY", "true")];

/// Whether `path` is libtpu (`libtpu.so`, `libtpu-nightly.so`, ...).
pub fn is_libtpu(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("libtpu") && n.ends_with(".so"))
}

/// The variables of [`QUIET_ENV`] that `current` (a lookup of the process's
/// environment) leaves unset: what a load must set.
pub fn missing(current: impl Fn(&str) -> Option<String>) -> Vec<(&'static str, &'static str)> {
    QUIET_ENV
        .iter()
        .copied()
        .filter(|(k, _)| current(k).is_none())
        .collect()
}

/// Sets the missing variables in this process. Called under the plugin
/// cache's lock, before the library's initializers run.
pub(crate) fn prepare() {
    for (k, v) in missing(|k| std::env::var(k).ok()) {
        tracing::debug!(
            var = k,
            value = v,
            "set for libtpu: it would query a metadata server"
        );
        std::env::set_var(k, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtpu_is_known_by_its_file_name() {
        assert!(is_libtpu(Path::new("/x/site-packages/libtpu/libtpu.so")));
        assert!(is_libtpu(Path::new("libtpu-nightly.so")));
        assert!(!is_libtpu(Path::new("/x/xla_cpu_pjrt.so")));
        assert!(!is_libtpu(Path::new("/x/libtpu/sdk.so")));
    }

    #[test]
    fn a_variable_the_user_set_is_left_alone() {
        assert_eq!(missing(|_| None), vec![("TPU_SKIP_MDS_QUERY", "true")]);
        assert!(missing(|_| Some("false".into())).is_empty());
    }
}
