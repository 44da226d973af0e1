//! `cargo xtask android-run` against a fake `adb` that keeps a device's files in a folder, runs
//! device shell commands with the host's `sh`, records every call, and simulates the failures a
//! real phone produces. The "pi2" pushed is a shell script standing in for the aarch64 binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The fake adb. `FAKE_ADB_DEVICES` is `serial:state` pairs separated by spaces; the device's
/// `/data/local/tmp` lives under `$FAKE_ADB_ROOT`; `FAKE_ADB_DF_AVAIL` is the free KiB `df -k`
/// reports; `FAKE_ADB_FAIL_PUSH=1` makes pushes fail like a full device.
const FAKE_ADB: &str = r#"#!/bin/sh
echo "$*" >> "$FAKE_ADB_LOG"
if [ "$1" = devices ]; then
  echo "List of devices attached"
  for d in $FAKE_ADB_DEVICES; do printf '%s\t%s\n' "${d%%:*}" "${d#*:}"; done
  exit 0
fi
[ "$1" = -s ] || { echo "adb: more than one device/emulator" >&2; exit 1; }
serial=$2; shift 2
case " $FAKE_ADB_DEVICES " in
  *" $serial:device "*) ;;
  *) echo "adb: device '$serial' not found" >&2; exit 1 ;;
esac
map() { printf '%s' "$1" | sed "s#/data/local/tmp#$FAKE_ADB_ROOT/data/local/tmp#g"; }
case "$1" in
  push)
    if [ -n "$FAKE_ADB_FAIL_PUSH" ]; then
      echo "adb: error: failed to copy '$2' to '$3': remote No space left on device" >&2; exit 1
    fi
    dst=$(map "$3"); mkdir -p "$(dirname "$dst")"; cp "$2" "$dst" && echo "$2: 1 file pushed" ;;
  pull)
    cp -r "$(map "$2")" "$3" ;;
  shell)
    shift
    script=$(map "$*")
    exec sh -c "df() { echo 'Filesystem 1K-blocks Used Available Use% Mounted on'; echo \"/dev/block/dm-5 115000000 1000 ${FAKE_ADB_DF_AVAIL:-90000000} 1% /data\"; }; $script" ;;
  *) echo "fake adb: unsupported $1" >&2; exit 1 ;;
esac
"#;

/// Stands in for pi2 on the device: echoes its arguments, writes a result file, exits with 3.
const FAKE_PI2: &str = r#"#!/bin/sh
echo "fake pi2 got: $*"
printf 'streamed without newline'
echo '{"tokens_per_second": 12.5}' > result.json
exit 3
"#;

struct Phone {
    dir: tempfile::TempDir,
}

impl Phone {
    fn new() -> Phone {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(dir.path().join("root")).unwrap();
        for (name, text) in [("bin/adb", FAKE_ADB), ("pi2", FAKE_PI2)] {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            make_executable(&p);
        }
        std::fs::write(dir.path().join("model.gguf"), vec![7u8; 10_000]).unwrap();
        std::fs::write(dir.path().join("corpus.txt"), "some text").unwrap();
        Phone { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs `xtask android-run` with the fake pi2, the fake model and a results folder.
    fn run(&self, devices: &str, env: &[(&str, &str)], extra: &[&str]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
        let path = format!(
            "{}:{}",
            self.path("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        cmd.env("PATH", path)
            .env_remove("PI2_ADB")
            .env("FAKE_ADB_DEVICES", devices)
            .env("FAKE_ADB_ROOT", self.path("root"))
            .env("FAKE_ADB_LOG", self.path("adb.log"))
            .args(["android-run", "--binary"])
            .arg(self.path("pi2"))
            .arg("--model")
            .arg(self.path("model.gguf"))
            .arg("--out")
            .arg(self.path("results"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.args(extra);
        cmd.output().unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("adb.log")).unwrap_or_default()
    }
}

fn make_executable(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn push_run_stream_pull_and_exit_code() {
    let phone = Phone::new();
    let corpus = phone.path("corpus.txt");
    let args = [
        "--push",
        corpus.to_str().unwrap(),
        "--",
        "bench",
        "-p",
        "it's 64",
    ];
    let out = phone.run("R58M123:device", &[], &args);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    // (The fake device maps its paths into a folder; map them back.)
    let stdout =
        String::from_utf8_lossy(&out.stdout).replace(phone.path("root").to_str().unwrap(), "");
    // The pushed model is passed with -m, arguments arrive intact, output streams unchanged.
    assert_eq!(
        stdout,
        "fake pi2 got: bench -m /data/local/tmp/pi2/model.gguf -p it's 64\nstreamed without newline"
    );
    let device = phone.path("root/data/local/tmp/pi2");
    assert!(device.join("pi2").exists() && device.join("model.gguf").exists());
    assert!(device.join("run/corpus.txt").exists());

    // The results folder holds stdout and the file pi2 wrote, not the files we pushed.
    let runs: Vec<_> = std::fs::read_dir(phone.path("results"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(runs.len(), 1);
    assert!(runs[0]
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("R58M123-"));
    assert_eq!(
        std::fs::read_to_string(runs[0].join("result.json")).unwrap(),
        "{\"tokens_per_second\": 12.5}\n"
    );
    assert_eq!(
        std::fs::read(runs[0].join("stdout.txt")).unwrap(),
        out.stdout
    );
    assert!(!runs[0].join("corpus.txt").exists());
    let model_pushes = |log: &str| {
        log.lines()
            .filter(|l| l.contains("push") && l.contains("model.gguf"))
            .count()
    };
    assert_eq!(model_pushes(&phone.log()), 1);

    // Second run: the model's hash matches on the device, so only the binary is pushed again.
    let out = phone.run("R58M123:device", &[], &["--", "info"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("already on the device (sha256 matches)"));
    assert_eq!(model_pushes(&phone.log()), 1);

    // A changed model is pushed again.
    std::fs::write(phone.path("model.gguf"), vec![8u8; 10_000]).unwrap();
    let out = phone.run("R58M123:device", &[], &["--", "info"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(model_pushes(&phone.log()), 2);
}

#[test]
fn a_user_model_path_is_left_alone() {
    let phone = Phone::new();
    let out = phone.run(
        "emulator-5554:device",
        &[],
        &["--no-model", "--", "run", "-m", "/sdcard/other.gguf"],
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().next().unwrap(),
        "fake pi2 got: run -m /sdcard/other.gguf"
    );
}

/// Each failure stops before running anything, with a message that says what to do.
#[test]
fn device_problems_get_clear_messages() {
    let phone = Phone::new();
    /// (devices listing, fake adb overrides, extra args, expected message)
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [&'a str], &'a str);
    let cases: [Case; 6] = [
        ("", &[], &[], "no Android device found"),
        (
            "A:device B:device",
            &[],
            &[],
            "2 devices connected (A, B): choose one with --serial",
        ),
        (
            "A:device",
            &[],
            &["--serial", "C"],
            "device `C` is not connected (connected: A)",
        ),
        (
            "A:unauthorized",
            &[],
            &[],
            "accept the USB debugging prompt",
        ),
        (
            "A:device",
            &[("FAKE_ADB_DF_AVAIL", "10")],
            &[],
            "not enough storage on the device",
        ),
        (
            "A:device",
            &[("FAKE_ADB_FAIL_PUSH", "1")],
            &[],
            "No space left on device",
        ),
    ];
    for (devices, env, opts, needle) in cases {
        let mut args = opts.to_vec();
        args.extend(["--", "info"]);
        let out = phone.run(devices, env, &args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{devices}: {err}");
        let last = err.lines().last().unwrap_or("");
        assert!(
            last.starts_with("xtask: ") && last.contains(needle),
            "{devices} {env:?}: {err}"
        );
        assert!(!err.contains("fake pi2"), "{err}");
    }
    // Two devices are fine once one is chosen.
    let out = phone.run("A:device B:device", &[], &["--serial", "B", "--", "info"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
}

#[test]
fn missing_adb_says_how_to_install_it() {
    let phone = Phone::new();
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .env("PATH", phone.path("nothing-here"))
        .env_remove("PI2_ADB")
        .args(["android-run", "--binary"])
        .arg(phone.path("pi2"))
        .args(["--", "info"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("adb not found: install it (Debian/Ubuntu: `sudo apt install adb`")
    );
}

/// With Debian's real `adb` and no phone attached (CI sets `PI2_TEST_REAL_ADB=1` after installing
/// it), the loop stops at device discovery with the same clear message.
#[test]
fn real_adb_without_a_phone_says_so() {
    if std::env::var_os("PI2_TEST_REAL_ADB").is_none() {
        eprintln!("skipped: set PI2_TEST_REAL_ADB=1 where Debian's adb is installed");
        return;
    }
    let phone = Phone::new();
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .env_remove("PI2_ADB")
        .args(["android-run", "--binary"])
        .arg(phone.path("pi2"))
        .args(["--", "info"])
        .output()
        .unwrap();
    let _ = Command::new("adb").arg("kill-server").output();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no Android device found"),
        "{}",
        stderr(&out)
    );
}
