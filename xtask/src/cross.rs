//! aarch64 under qemu-user: the phone's stand-in on any Linux box, and the CI check that the
//! aarch64 build generates what this machine generates.

use crate::android::build_musl;
use crate::{default_model, split_at_dashes, workspace_root, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn find_qemu() -> Result<PathBuf> {
    ["qemu-aarch64-static", "qemu-aarch64"]
        .iter()
        .flat_map(|name| {
            std::env::var_os("PATH")
                .into_iter()
                .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .map(move |d| d.join(name))
        })
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "qemu-aarch64-static not found: install it (Debian/Ubuntu: `sudo apt install \
             qemu-user-static`)"
                .to_string()
        })
}

fn qemu_command(qemu: &Path, cpu: &str, binary: &Path, args: &[String]) -> Command {
    let mut cmd = Command::new(qemu);
    cmd.arg("-cpu").arg(cpu).arg(binary).args(args);
    cmd.current_dir(workspace_root());
    cmd
}

/// `qemu-run [--cpu NAME] -- <pi2 args>`: returns pi2's exit code.
pub fn qemu_run_cmd(args: &[String]) -> Result<i32> {
    let (opts, pi2_args) = split_at_dashes(args);
    let mut cpu = "max".to_string();
    let mut it = opts.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--cpu" => cpu = it.next().cloned().ok_or("qemu-run: --cpu needs a value")?,
            other => return Err(format!("qemu-run: unknown option `{other}`")),
        }
    }
    let qemu = find_qemu()?;
    let binary = build_musl(true)?;
    let status = qemu_command(&qemu, &cpu, &binary, pi2_args)
        .status()
        .map_err(|e| format!("cannot start {}: {e}", qemu.display()))?;
    Ok(status.code().unwrap_or(1))
}

fn generated_ids(out: &Output, what: &str) -> Result<Vec<u64>> {
    if !out.status.success() {
        return Err(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{what}: output is not JSON: {e}"))?;
    v["generated_ids"]
        .as_array()
        .and_then(|a| a.iter().map(Value::as_u64).collect())
        .ok_or_else(|| format!("{what}: no generated_ids in its JSON"))
}

/// Greedy generation on the test model, aarch64 (qemu, dotprod kernels) against this machine's
/// build, on llama.cpp's golden prompts: the same tokens, every one (the kernel tiers compute one
/// function of the file).
pub fn check_cmd(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        return Err(format!("cross-check: unknown option `{a}`"));
    }
    const N_TOKENS: usize = 16;
    let model = default_model()?;
    let qemu = find_qemu()?;
    let arm = build_musl(true)?;
    let mut host = crate::cargo();
    host.args(["build", "--release", "--package", "pi2-cli", "--bin", "pi2"]);
    crate::run(host)?;
    let host_bin = workspace_root().join("target/release/pi2");

    let golden_path = workspace_root().join("testdata/golden/greedy.json");
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(&golden_path)
            .map_err(|e| format!("{}: {e}", golden_path.display()))?,
    )
    .map_err(|e| format!("{}: {e}", golden_path.display()))?;
    let cases: Vec<&Value> = golden["cases"]
        .as_array()
        .ok_or("greedy.json has no cases")?
        .iter()
        .filter(|c| c["chat_template_applied"] == false)
        .take(3)
        .collect();
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        let prompt = case["text"].as_str().ok_or("case without text")?;
        let pi2_args: Vec<String> = [
            "run",
            "-m",
            &model.to_string_lossy(),
            "-p",
            prompt,
            "-n",
            &N_TOKENS.to_string(),
            "--temp",
            "0",
            "--ignore-eos",
            "--json",
            "-t",
            "2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let host_out = Command::new(&host_bin)
            .args(&pi2_args)
            .current_dir(workspace_root())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", host_bin.display()))?;
        let host_ids = generated_ids(&host_out, "host pi2")?;
        let arm_out = qemu_command(&qemu, "max", &arm, &pi2_args)
            .output()
            .map_err(|e| format!("cannot run qemu: {e}"))?;
        let arm_ids = generated_ids(&arm_out, "aarch64 pi2 under qemu")?;
        // Every kernel tier computes the same function of a quantized file (exact integer sums
        // per block, one float formula and order), so the phone build's tokens are this
        // machine's, every one.
        let verdict = match host_ids.iter().zip(&arm_ids).position(|(x, y)| x != y) {
            None if host_ids.len() == arm_ids.len() => "identical".to_string(),
            parted => {
                let msg = format!(
                    "part at step {}",
                    parted.unwrap_or(host_ids.len().min(arm_ids.len()))
                );
                failures.push(format!("{name}: {msg}"));
                msg
            }
        };
        println!(
            "{name:<20} host {host_ids:?}\n{:<20} qemu {arm_ids:?}\n{:<20} {verdict}",
            "", ""
        );
    }
    if failures.is_empty() {
        println!("cross-check: aarch64 (qemu -cpu max) agrees with the host build");
        Ok(())
    } else {
        Err(format!("cross-check failed: {}", failures.join("; ")))
    }
}
