//! libtpu (its PyPI wheel, PJRT C API 0.117) through tessel on a machine
//! with no TPU and no network: it must load and fail cleanly at once,
//! without asking a cloud metadata server for its slice.
//!
//! The check runs in a network namespace of its own (nothing leaves the
//! machine) where the metadata server's address and name
//! (169.254.169.254, metadata.google.internal) lead to a stand-in that
//! records every request and answers 503. Needs root (namespaces) and
//! libtpu in the plugin folder (`./scripts/test` installs it).

use std::process::Command;
use std::time::{Duration, Instant};

use tessel_chaos_tests::tessel_bin;

/// What the namespace runs: the stand-in, then `tessel plugin info`.
const SCRIPT: &str = r#"
set -e
ip link set lo up
ip addr add 169.254.169.254/32 dev lo
cp /etc/hosts "$T/hosts"; echo "169.254.169.254 metadata.google.internal metadata" >> "$T/hosts"
mount --bind "$T/hosts" /etc/hosts
python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("169.254.169.254", 80)); s.listen(64)
while True:
    c, _ = s.accept(); line = c.recv(4096).split(b"\r\n")[0]
    print("request", line.decode(errors="replace"), flush=True)
    c.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"); c.close()
' > "$T/requests" 2>&1 &
sleep 0.3
set +e
timeout 120 "$TESSEL" plugin info --plugin tpu > "$T/out" 2>&1
echo "exit $?" >> "$T/out"
kill %1
"#;

fn plugin_dir() -> std::path::PathBuf {
    std::env::var_os("TESSEL_PLUGIN_DIR")
        .map(Into::into)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tessel/plugins")
        })
}

#[test]
fn libtpu_loads_and_fails_cleanly_without_asking_a_metadata_server() {
    let lib = plugin_dir().join("libtpu/libtpu.so");
    assert!(
        lib.is_file(),
        "{} is missing: ./scripts/test installs libtpu",
        lib.display()
    );
    let tmp = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let status = Command::new("unshare")
        .args(["--net", "--mount", "--", "bash", "-c", SCRIPT])
        .env("T", tmp.path())
        .env("TESSEL", tessel_bin())
        .env("TESSEL_PLUGIN_DIR", plugin_dir())
        // As a user who never heard of the variable would run it.
        .env_remove("TPU_SKIP_MDS_QUERY")
        .status()
        .unwrap();
    let took = started.elapsed();
    assert!(status.success(), "the namespace's script failed: {status}");
    let out = std::fs::read_to_string(tmp.path().join("out")).unwrap();
    let requests = std::fs::read_to_string(tmp.path().join("requests")).unwrap();
    assert!(out.contains("C API"), "libtpu did not load: {out}");
    assert!(
        out.contains("No jellyfish device found") && out.trim_end().ends_with("exit 1"),
        "expected a clean failure for want of a TPU: {out}"
    );
    assert!(
        !requests.contains("request"),
        "libtpu asked the metadata server: {requests}"
    );
    assert!(
        took < Duration::from_secs(30),
        "loading libtpu took {took:?}"
    );
    eprintln!("libtpu: loaded and refused (no TPU) in {took:?}, no metadata request");
}
