//! `c-example [--aarch64]`: builds `examples/c/generate.c` with the system's C compiler against
//! the committed header and the static C library, runs it on the test model, and checks that it
//! prints what `pi2 run --temp 0` generates. With `--aarch64` also the phone target: the library
//! for aarch64 (glibc, `aarch64-linux-gnu-gcc`), the example linked statically and run under
//! qemu, against the aarch64 `pi2` under qemu.

use crate::cross::find_qemu;
use crate::{cargo, default_model, run, workspace_root, Result};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

const PROMPTS: [&str; 2] = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
];
const N: &str = "24";
const ARM_TARGET: &str = "aarch64-unknown-linux-gnu";
const ARM_CC: &str = "aarch64-linux-gnu-gcc";

pub fn cmd(args: &[String]) -> Result<()> {
    let mut aarch64 = false;
    for a in args {
        match a.as_str() {
            "--aarch64" => aarch64 = true,
            other => return Err(format!("c-example: unknown option `{other}`")),
        }
    }
    let model = default_model()?;
    let root = workspace_root();
    let out_dir = root.join("target/c-example");
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;

    let mut build = cargo();
    build.args(["build", "--release", "-p", "pi2-capi", "-p", "pi2-cli"]);
    run(build)?;
    let host = out_dir.join("generate");
    compile(
        "cc",
        &root.join("target/release/libpi2_capi.a"),
        &host,
        false,
    )?;
    let pi2 = root.join("target/release/pi2");
    let mut failures = Vec::new();
    for p in PROMPTS {
        let want = pi2_text(Command::new(&pi2), &model, p)?;
        let got = example_text(Command::new(&host), &model, p)?;
        report("host", p, &got, &want, &mut failures);
    }
    if aarch64 {
        let qemu = find_qemu()?;
        crate::android::ensure_rust_target(ARM_TARGET)?;
        let mut build = cargo();
        build
            .args([
                "build",
                "--release",
                "-p",
                "pi2-capi",
                "--no-default-features",
            ])
            .args(["--target", ARM_TARGET])
            .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", ARM_CC);
        run(build)?;
        let lib = root
            .join("target")
            .join(ARM_TARGET)
            .join("release/libpi2_capi.a");
        let arm = out_dir.join("generate-aarch64");
        compile(ARM_CC, &lib, &arm, true)?;
        let arm_pi2 = crate::android::build_musl(true)?;
        let under_qemu = |bin: &Path| {
            let mut c = Command::new(&qemu);
            c.args(["-cpu", "max"]).arg(bin);
            c
        };
        for p in PROMPTS {
            let want = pi2_text(under_qemu(&arm_pi2), &model, p)?;
            let got = example_text(under_qemu(&arm), &model, p)?;
            report("aarch64 (qemu)", p, &got, &want, &mut failures);
        }
    }
    if failures.is_empty() {
        println!("c-example: the C example prints what `pi2 run --temp 0` generates");
        Ok(())
    } else {
        Err(format!("c-example failed: {}", failures.join("; ")))
    }
}

/// Compiles the example with `cc` against the header and `lib` (statically linked for qemu).
fn compile(cc: &str, lib: &Path, out: &Path, static_link: bool) -> Result<()> {
    let root = workspace_root();
    let mut c = Command::new(cc);
    c.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2"])
        .arg(root.join("examples/c/generate.c"))
        .arg("-I")
        .arg(root.join("crates/pi2-capi/include"))
        .arg(lib)
        .args(["-lm", "-lpthread", "-ldl"])
        .arg("-o")
        .arg(out);
    if static_link {
        c.arg("-static");
    }
    run(c).map_err(|e| format!("cannot build the C example with {cc}: {e}"))
}

fn pi2_text(mut c: Command, model: &Path, prompt: &str) -> Result<String> {
    c.args(["run", "-m"])
        .arg(model)
        .args(["-p", prompt, "-n", N, "--temp", "0", "--json", "-t", "2"]);
    let out = c
        .current_dir(workspace_root())
        .output()
        .map_err(|e| format!("cannot run pi2: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pi2 run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("pi2 run --json: {e}"))?;
    v["text"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| "pi2 run --json has no text".into())
}

fn example_text(mut c: Command, model: &Path, prompt: &str) -> Result<String> {
    c.arg(model).args([prompt, N]);
    let out = c
        .current_dir(workspace_root())
        .output()
        .map_err(|e| format!("cannot run the C example: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the C example failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).map_err(|e| format!("C example output: {e}"))?;
    // The example ends its output with a newline of its own.
    Ok(text.strip_suffix('\n').unwrap_or(&text).to_string())
}

fn report(what: &str, prompt: &str, got: &str, want: &str, failures: &mut Vec<String>) {
    let same = got == want;
    println!(
        "{what:<15} {:<28} {}",
        format!("{:?}", prompt.lines().next().unwrap_or("")),
        if same { "identical" } else { "DIFFERS" }
    );
    if !same {
        println!("  C example: {got:?}\n  pi2 run:   {want:?}");
        failures.push(format!("{what}: {prompt:?}"));
    }
}
