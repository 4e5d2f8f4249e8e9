//! The JAX side of the benchmarks: `n` Python processes running one of the
//! scripts in `scripts/` (embedded), joined through `jax.distributed` on a
//! free loopback port, each printing one JSON line.

use anyhow::{Context, Result};

/// Runs `script` in `n` processes of `python` (CPU only) with arguments
/// `ADDRESS N I extra...`; returns each process's last JSON line, in
/// process order.
pub fn run_group(
    python: &std::path::Path,
    script: &str,
    n: u32,
    extra: &[String],
) -> Result<Vec<serde_json::Value>> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let address = format!("127.0.0.1:{port}");
    let mut children = Vec::new();
    for i in 0..n {
        let child = std::process::Command::new(python)
            .args(["-c", script, &address, &n.to_string(), &i.to_string()])
            .args(extra)
            .env("JAX_PLATFORMS", "cpu")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", python.display()))?;
        children.push(child);
    }
    let mut out = Vec::new();
    for c in children {
        let o = c.wait_with_output()?;
        // Gloo prints its own lines; ours is the last JSON object.
        let text = String::from_utf8_lossy(&o.stdout);
        let v = text
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
            .with_context(|| format!("a JAX process printed no JSON line: `{}`", text.trim()))?;
        out.push(v);
    }
    Ok(out)
}
