//! Property: the Rust API example runs end to end and its check holds.

#[test]
fn the_rust_example_trains_the_mlp_and_matches_one_device() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_rust-submit"));
    let tessel = bin.with_file_name("tessel");
    assert!(
        tessel.is_file(),
        "{} is missing: build it with `cargo build --bin tessel`",
        tessel.display()
    );
    let out = std::process::Command::new(bin)
        .args(["--steps", "200"])
        .env(
            "TESSEL_PJRT_PLUGIN",
            std::env::var("TESSEL_PJRT_PLUGIN").unwrap_or_else(|_| "cpu".into()),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("-> Succeeded") && stdout.ends_with("ok\n"),
        "{stdout}"
    );
}
