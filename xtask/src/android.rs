//! Android: the static aarch64 build and the adb push/run/pull loop.
//!
//! The build needs no NDK: `aarch64-unknown-linux-musl` linked by rust-lld is a fully static
//! binary that Android's kernel runs as is. With `ANDROID_NDK_HOME` set, the `aarch64-linux-android`
//! target (bionic, dynamic) is built too through the NDK's clang.
//!
//! `adb` is taken from `$PI2_ADB`, else from `PATH`.

use crate::{cargo, default_model, run, split_at_dashes, workspace_root, Result};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub const MUSL_TARGET: &str = "aarch64-unknown-linux-musl";
const NDK_TARGET: &str = "aarch64-linux-android";
const REMOTE_DIR: &str = "/data/local/tmp/pi2";
/// pi2 subcommands that take `-m`: android-run adds the pushed model to them.
const MODEL_COMMANDS: &[&str] = &["run", "chat", "tokenize", "perplexity", "info", "bench"];
/// Printed by the remote shell after pi2 exits; `adb shell` of old devices drops exit codes.
const EXIT_MARKER: &[u8] = b"\n__PI2_EXIT__=";

pub fn ensure_rust_target(target: &str) -> Result<()> {
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map_err(|e| {
            format!("cannot run rustup ({e}); install the {target} standard library by hand")
        })?;
    if !String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == target)
    {
        eprintln!("xtask: adding the rustup target {target}");
        let mut cmd = Command::new("rustup");
        cmd.args(["target", "add", target]);
        run(cmd)?;
    }
    Ok(())
}

/// Builds `pi2` for the static aarch64 target and returns the binary's path.
pub fn build_musl(release: bool) -> Result<PathBuf> {
    ensure_rust_target(MUSL_TARGET)?;
    let mut cmd = cargo();
    // Without `download`: the TLS stack's C code would need an aarch64 C compiler.
    cmd.args([
        "build",
        "--package",
        "pi2-cli",
        "--bin",
        "pi2",
        "--no-default-features",
    ])
    .args(["--target", MUSL_TARGET]);
    if release {
        cmd.arg("--release");
    }
    let linker_var = "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER";
    if std::env::var_os(linker_var).is_none() {
        cmd.env(linker_var, "rust-lld");
    }
    run(cmd)?;
    Ok(target_binary(MUSL_TARGET, release))
}

fn target_binary(target: &str, release: bool) -> PathBuf {
    let profile = if release { "release" } else { "debug" };
    workspace_root()
        .join("target")
        .join(target)
        .join(profile)
        .join("pi2")
}

fn build_ndk(ndk: &Path, release: bool) -> Result<PathBuf> {
    let api = std::env::var("PI2_ANDROID_API").unwrap_or_else(|_| "24".into());
    let bin = ndk.join("toolchains/llvm/prebuilt/linux-x86_64/bin");
    let clang = bin.join(format!("{NDK_TARGET}{api}-clang"));
    if !clang.exists() {
        return Err(format!(
            "ANDROID_NDK_HOME is set but {} does not exist (API level {api}; set PI2_ANDROID_API)",
            clang.display()
        ));
    }
    ensure_rust_target(NDK_TARGET)?;
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--package",
        "pi2-cli",
        "--bin",
        "pi2",
        "--target",
        NDK_TARGET,
    ])
    .env("CARGO_TARGET_AARCH64_LINUX_ANDROID_LINKER", &clang)
    .env("AR_aarch64_linux_android", bin.join("llvm-ar"))
    .env("CC_aarch64_linux_android", &clang);
    if release {
        cmd.arg("--release");
    }
    run(cmd)?;
    Ok(target_binary(NDK_TARGET, release))
}

fn describe(path: &Path) -> Result<String> {
    let size = std::fs::metadata(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    Ok(format!(
        "{} ({:.1} MiB)",
        path.display(),
        size as f64 / (1 << 20) as f64
    ))
}

pub fn build_cmd(args: &[String]) -> Result<()> {
    let mut release = false;
    for a in args {
        match a.as_str() {
            "--release" => release = true,
            other => return Err(format!("android-build: unknown option `{other}`")),
        }
    }
    let musl = build_musl(release)?;
    println!(
        "static binary (any aarch64 Android or Linux): {}",
        describe(&musl)?
    );
    if let Some(ndk) = std::env::var_os("ANDROID_NDK_HOME") {
        let ndk_bin = build_ndk(Path::new(&ndk), release)?;
        println!(
            "NDK binary (aarch64-linux-android): {}",
            describe(&ndk_bin)?
        );
    }
    Ok(())
}

/// `adb` from `$PI2_ADB` or `PATH`.
fn find_adb() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("PI2_ADB") {
        return Ok(PathBuf::from(p));
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("adb"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "adb not found: install it (Debian/Ubuntu: `sudo apt install adb`; elsewhere Android \
             SDK platform-tools) or point PI2_ADB at it"
                .to_string()
        })
}

/// One device, reached through `adb -s SERIAL`.
struct Device {
    adb: PathBuf,
    serial: String,
}

/// Picks the device from `adb devices`, or says exactly why none can be used.
fn pick_device(adb: &Path, serial: Option<&str>) -> Result<Device> {
    let out = Command::new(adb)
        .arg("devices")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", adb.display()))?;
    if !out.status.success() {
        return Err(format!(
            "`adb devices` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let devices: Vec<(String, String)> = text
        .lines()
        .skip_while(|l| !l.starts_with("List of devices"))
        .skip(1)
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.to_string(), it.next()?.to_string()))
        })
        .collect();
    let chosen = match (serial, devices.as_slice()) {
        (_, []) => {
            return Err(
                "no Android device found: connect a phone with USB debugging on \
                        (Settings > Developer options) and check `adb devices`"
                    .into(),
            )
        }
        (Some(s), _) => devices.iter().find(|(d, _)| d == s).ok_or_else(|| {
            format!(
                "device `{s}` is not connected (connected: {})",
                devices
                    .iter()
                    .map(|d| d.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?,
        (None, [one]) => one,
        (None, many) => {
            return Err(format!(
                "{} devices connected ({}): choose one with --serial",
                many.len(),
                many.iter()
                    .map(|d| d.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    };
    match chosen.1.as_str() {
        "device" => Ok(Device {
            adb: adb.to_path_buf(),
            serial: chosen.0.clone(),
        }),
        "unauthorized" => Err(format!(
            "device `{}` is unauthorized: unlock the phone and accept the USB debugging prompt",
            chosen.0
        )),
        state => Err(format!(
            "device `{}` is {state}: reconnect it or restart adb (`adb kill-server`)",
            chosen.0
        )),
    }
}

/// Quotes one argument for the device's `sh`.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl Device {
    fn adb(&self) -> Command {
        let mut cmd = Command::new(&self.adb);
        cmd.arg("-s").arg(&self.serial);
        cmd
    }

    /// Runs `adb -s SERIAL <args>` and returns its stdout; on failure, `what` and adb's reason
    /// (stderr, or stdout where adb reports there).
    fn call(&self, args: &[&std::ffi::OsStr], what: &str) -> Result<String> {
        let out = self
            .adb()
            .args(args)
            .output()
            .map_err(|e| format!("cannot run adb: {e}"))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
            let why = if err.is_empty() {
                String::from_utf8_lossy(&out.stdout).trim().to_string()
            } else {
                err
            };
            return Err(format!("{what} failed: {why}"));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs a shell command on the device and returns its stdout.
    fn shell(&self, script: &str) -> Result<String> {
        self.call(
            &["shell".as_ref(), script.as_ref()],
            &format!("`adb shell {script}`"),
        )
    }

    fn push(&self, local: &Path, remote: &str) -> Result<()> {
        let what = format!("pushing {} to {remote}", local.display());
        self.call(
            &["push".as_ref(), local.as_os_str(), remote.as_ref()],
            &what,
        )
        .map(drop)
    }

    fn pull(&self, remote: &str, local: &Path) -> Result<()> {
        let what = format!("pulling {remote}");
        self.call(
            &["pull".as_ref(), remote.as_ref(), local.as_os_str()],
            &what,
        )
        .map(drop)
    }

    /// Free bytes under `dir` on the device (from `df -k`); `None` if the output is not understood.
    fn free_bytes(&self, dir: &str) -> Option<u64> {
        let out = self.shell(&format!("df -k {dir}")).ok()?;
        let line = out.lines().rfind(|l| !l.trim().is_empty())?;
        let avail: u64 = line.split_whitespace().nth(3)?.parse().ok()?;
        Some(avail * 1024)
    }

    fn remote_sha256(&self, path: &str) -> Option<String> {
        let out = self
            .shell(&format!("sha256sum {} 2>/dev/null", shell_quote(path)))
            .ok()?;
        out.split_whitespace().next().map(str::to_string)
    }
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[derive(Default)]
struct RunOptions {
    serial: Option<String>,
    model: Option<PathBuf>,
    binary: Option<PathBuf>,
    push: Vec<PathBuf>,
    out: Option<PathBuf>,
    no_model: bool,
}

fn parse_run_options(args: &[String]) -> Result<RunOptions> {
    let mut o = RunOptions::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("android-run: {a} needs a value"))
        };
        match a.as_str() {
            "--serial" | "-s" => o.serial = Some(value()?),
            "--model" => o.model = Some(value()?.into()),
            "--binary" => o.binary = Some(value()?.into()),
            "--push" => o.push.push(value()?.into()),
            "--out" => o.out = Some(value()?.into()),
            "--no-model" => o.no_model = true,
            other => return Err(format!("android-run: unknown option `{other}`")),
        }
    }
    Ok(o)
}

/// Pushes pi2 (and the model), runs it on the phone, streams its output, pulls what it wrote
/// and returns its exit code.
pub fn run_cmd(args: &[String]) -> Result<i32> {
    let (opts, pi2_args) = split_at_dashes(args);
    let o = parse_run_options(opts)?;
    let device = pick_device(&find_adb()?, o.serial.as_deref())?;
    eprintln!("xtask: device {}", device.serial);

    let binary = match &o.binary {
        Some(b) => b.clone(),
        None => build_musl(true)?,
    };
    let user_gave_model = pi2_args
        .iter()
        .any(|a| a == "-m" || a == "--model" || a.starts_with("--model="));
    let takes_model = !user_gave_model
        && pi2_args
            .first()
            .is_some_and(|c| MODEL_COMMANDS.contains(&c.as_str()));
    let model = match &o.model {
        Some(m) => Some(m.clone()),
        None if takes_model && !o.no_model => Some(default_model()?),
        None => None,
    };
    for f in o.push.iter().chain(&model).chain([&binary]) {
        if !f.is_file() {
            return Err(format!("{} is not a file", f.display()));
        }
    }

    device.shell(&format!("mkdir -p {REMOTE_DIR}"))?;
    // Push the model only when the device's copy differs (models are large, phones slow).
    let mut model_to_push = None;
    let remote_model = model.as_ref().map(|m| {
        let name = m.file_name().unwrap_or_default().to_string_lossy();
        format!("{REMOTE_DIR}/{name}")
    });
    if let (Some(m), Some(remote)) = (&model, &remote_model) {
        let local_hash = sha256_file(m)?;
        if device.remote_sha256(remote).as_deref() == Some(local_hash.as_str()) {
            eprintln!("xtask: {remote} is already on the device (sha256 matches)");
        } else {
            model_to_push = Some(m.clone());
        }
    }
    let needed: u64 = [Some(&binary), model_to_push.as_ref()]
        .into_iter()
        .flatten()
        .chain(&o.push)
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum();
    if let Some(free) = device.free_bytes(REMOTE_DIR) {
        // Keep a margin: a full /data makes the phone misbehave.
        let margin = 64 << 20;
        if free < needed + margin {
            return Err(format!(
                "not enough storage on the device: {REMOTE_DIR} needs {:.1} MiB (plus 64 MiB \
                 spare) but has {:.1} MiB free",
                needed as f64 / (1 << 20) as f64,
                free as f64 / (1 << 20) as f64
            ));
        }
    } else {
        eprintln!("xtask: cannot read free storage on the device (df -k); pushing anyway");
    }
    device.push(&binary, &format!("{REMOTE_DIR}/pi2"))?;
    device.shell(&format!("chmod 755 {REMOTE_DIR}/pi2"))?;
    if let (Some(m), Some(remote)) = (&model_to_push, &remote_model) {
        eprintln!("xtask: pushing {} to {remote}", m.display());
        device.push(m, remote)?;
    }

    // A fresh working folder per run: whatever pi2 writes there is pulled back afterwards.
    let work = format!("{REMOTE_DIR}/run");
    device.shell(&format!("rm -rf {work} && mkdir -p {work}"))?;
    let mut pushed_names = Vec::new();
    for f in &o.push {
        let name = f
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        device.push(f, &format!("{work}/{name}"))?;
        pushed_names.push(name);
    }
    let mut argv: Vec<String> = pi2_args.to_vec();
    if let Some(remote) = &remote_model {
        if takes_model {
            argv.splice(1..1, ["-m".to_string(), remote.clone()]);
        }
    }
    let quoted: Vec<String> = argv.iter().map(|a| shell_quote(a)).collect();
    let script = format!(
        "cd {work} && ../pi2 {}; printf '\\n__PI2_EXIT__=%d\\n' $?",
        quoted.join(" ")
    );
    eprintln!("xtask: running pi2 {}", argv.join(" "));

    let out_root = o
        .out
        .clone()
        .unwrap_or_else(|| workspace_root().join("target/android-run"));
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let out_dir = out_root.join(format!(
        "{}-{stamp}",
        device.serial.replace(['/', ':'], "_")
    ));
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;

    let mut child = device
        .adb()
        .args(["shell", &script])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run adb: {e}"))?;
    let mut stdout = child.stdout.take().expect("piped");
    let mut log = Vec::new();
    let code = stream_until_marker(&mut stdout, &mut std::io::stdout(), &mut log)?;
    let _ = child.wait();
    std::fs::write(out_dir.join("stdout.txt"), &log)
        .map_err(|e| format!("{}: {e}", out_dir.display()))?;

    let listing = device.shell(&format!("ls -1A {work}"))?;
    let mut pulled = 0;
    for name in listing.lines().map(str::trim).filter(|n| !n.is_empty()) {
        if pushed_names.iter().any(|p| p == name) {
            continue;
        }
        device.pull(&format!("{work}/{name}"), &out_dir.join(name))?;
        pulled += 1;
    }
    eprintln!(
        "xtask: pi2 exited with {}; stdout and {pulled} result file(s) in {}",
        code.map_or("an unknown status".into(), |c| c.to_string()),
        out_dir.display()
    );
    code.ok_or_else(|| "lost the connection before pi2 finished (no exit status)".into())
}

/// Copies `src` to `dst` as it arrives (so generation streams), keeping a copy in `log`, until
/// the exit marker; returns the exit code written after it.
fn stream_until_marker(
    src: &mut impl Read,
    dst: &mut impl Write,
    log: &mut Vec<u8>,
) -> Result<Option<i32>> {
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = src
            .read(&mut buf)
            .map_err(|e| format!("reading adb output: {e}"))?;
        pending.extend_from_slice(&buf[..n]);
        if let Some(p) = pending
            .windows(EXIT_MARKER.len())
            .position(|w| w == EXIT_MARKER)
        {
            let (text, rest) = pending.split_at(p);
            emit(dst, log, text)?;
            let mut tail = rest[EXIT_MARKER.len()..].to_vec();
            src.read_to_end(&mut tail)
                .map_err(|e| format!("reading adb output: {e}"))?;
            let code = String::from_utf8_lossy(&tail).trim().parse().ok();
            return Ok(code);
        }
        if n == 0 {
            emit(dst, log, &pending)?;
            return Ok(None);
        }
        // Hold back only a tail that could be the start of the marker.
        let keep = (1..EXIT_MARKER.len().min(pending.len() + 1))
            .rev()
            .find(|&k| pending.ends_with(&EXIT_MARKER[..k]))
            .unwrap_or(0);
        let cut = pending.len() - keep;
        emit(dst, log, &pending[..cut])?;
        pending.drain(..cut);
    }
}

fn emit(dst: &mut impl Write, log: &mut Vec<u8>, bytes: &[u8]) -> Result<()> {
    log.extend_from_slice(bytes);
    dst.write_all(bytes)
        .and_then(|_| dst.flush())
        .map_err(|e| format!("writing output: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_marker_is_found_across_read_boundaries() {
        struct Drip<'a>(&'a [u8]);
        impl Read for Drip<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = self.0.len().min(3).min(buf.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let input = b"tokens _ and __ streamed\n__PI2_EXIT__=3\n";
        let (mut out, mut log) = (Vec::new(), Vec::new());
        let code = stream_until_marker(&mut Drip(input), &mut out, &mut log).unwrap();
        assert_eq!(code, Some(3));
        assert_eq!(out, b"tokens _ and __ streamed");
        assert_eq!(log, out);

        let (mut out, mut log) = (Vec::new(), Vec::new());
        let code = stream_until_marker(&mut Drip(b"cut off\n__PI2"), &mut out, &mut log).unwrap();
        assert_eq!(code, None);
        assert_eq!(out, b"cut off\n__PI2");
    }

    #[test]
    fn shell_quoting_survives_quotes() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
