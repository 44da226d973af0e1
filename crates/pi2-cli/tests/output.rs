//! Output that cannot be written (a full device) ends the process with one error line and exit
//! code 1, never a panic. Needs `cargo xtask fetch-model` and Linux's `/dev/full`.

mod common;

use common::{m, root};
use std::process::{Command, Stdio};

#[test]
fn a_full_device_ends_in_one_error_line() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped: no /dev/full on this system");
        return;
    };
    let cases: [&[&str]; 3] = [
        &["info", "-m", &m()],
        &["tokenize", "-m", &m(), "hello"],
        &["run", "-m", &m(), "-p", "hi", "-n", "4", "--temp", "0"],
    ];
    for args in cases {
        // Standard output on the full device: one error line on stderr.
        let out = Command::new(env!("CARGO_BIN_EXE_pi2"))
            .args(args)
            .current_dir(root())
            .stdout(full.try_clone().unwrap())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        let last = err.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
        assert!(
            last.starts_with("error: ") && last.contains("No space left"),
            "{args:?}: {err}"
        );
    }
    // Standard error on the full device too (a failing command): exit 1, no panic's 101.
    let out = Command::new(env!("CARGO_BIN_EXE_pi2"))
        .args(["info", "-m", "/nonexistent/model.gguf"])
        .stdout(Stdio::null())
        .stderr(full)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn no_command_writes_over_a_file_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n).display().to_string();
    std::fs::copy(common::model(), d("model.gguf")).unwrap();
    std::fs::copy(common::model(), d("X.trace")).unwrap();
    std::fs::write(
        d("cal.txt"),
        "In the beginning God created the heaven and the earth. ".repeat(40),
    )
    .unwrap();
    std::os::unix::fs::symlink(d("model.gguf"), d("link.json")).unwrap();
    let before = std::fs::metadata(d("model.gguf")).unwrap().len();
    let cases: [Vec<String>; 5] = [
        // The output is the model, with --force.
        [
            "profile",
            "-m",
            &d("model.gguf"),
            "-f",
            &d("cal.txt"),
            "-o",
            &d("model.gguf"),
            "--force",
        ]
        .map(String::from)
        .to_vec(),
        // A companion output (X.trace of X.json) is the model.
        [
            "profile",
            "-m",
            &d("X.trace"),
            "-f",
            &d("cal.txt"),
            "-o",
            &d("X.json"),
            "--force",
        ]
        .map(String::from)
        .to_vec(),
        // Through a symbolic link.
        [
            "profile",
            "-m",
            &d("model.gguf"),
            "-f",
            &d("cal.txt"),
            "-o",
            &d("link.json"),
            "--force",
        ]
        .map(String::from)
        .to_vec(),
        [
            "plan",
            "-m",
            &d("model.gguf"),
            "--mem-limit",
            "1G",
            "-o",
            &d("model.gguf"),
            "--force",
        ]
        .map(String::from)
        .to_vec(),
        [
            "convert",
            "-m",
            &d("model.gguf"),
            "-f",
            &d("cal.txt"),
            "--profile",
            &d("cal.txt"),
            "-o",
            &d("cal.txt"),
            "--force",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for args in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        common::fails_with(&args, "this command reads; choose another output file");
    }
    assert_eq!(std::fs::metadata(d("model.gguf")).unwrap().len(), before);
    assert_eq!(std::fs::metadata(d("X.trace")).unwrap().len(), before);
    // An output in a folder that does not exist: refused before any work, nothing created.
    let missing = dir.path().join("no/such/dir");
    for cmd in [
        vec![
            "profile-hw",
            "-m",
            &d("model.gguf"),
            "--kernel-ms",
            "1",
            "--read-ms",
            "1",
        ],
        vec!["profile", "-m", &d("model.gguf"), "-f", &d("cal.txt")],
    ] {
        let out = missing.join("out.json").display().to_string();
        let args: Vec<&str> = cmd.iter().copied().chain(["-o", &out]).collect();
        common::fails_with(
            &args,
            "does not exist (create it, or choose another output)",
        );
    }
    assert!(!dir.path().join("no").exists());
}

#[test]
fn absurd_contexts_are_refused_and_causes_are_not_repeated() {
    for c in ["9223372036854775808", "100000000"] {
        common::fails_with(
            &["run", "-m", &m(), "-p", "hi", "-c", c],
            "outside 1..16777216",
        );
    }
    let out = common::pi2(&[
        "run",
        "-m",
        &m(),
        "--sparse",
        "--sparsity",
        "0.5",
        "--profile",
        "/nonexistent/p.json",
        "-p",
        "hi",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
}

#[test]
fn pipes_and_tiny_contexts_are_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.gguf");
    let made = Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        // Opening a FIFO for reading would block until a writer came.
        common::fails_with(
            &["info", "-m", fifo.to_str().unwrap()],
            "not a regular file",
        );
    }
    let text = dir.path().join("t.txt");
    std::fs::write(&text, "word ".repeat(400)).unwrap();
    common::fails_with(
        &[
            "perplexity",
            "-m",
            &m(),
            "-f",
            text.to_str().unwrap(),
            "-c",
            "1",
        ],
        "too small",
    );
}

#[test]
fn a_model_file_truncated_mid_run_ends_in_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("m.gguf");
    std::fs::copy(common::model(), &copy).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_pi2"))
        .args([
            "run",
            "-m",
            copy.to_str().unwrap(),
            "-p",
            "Once",
            "-n",
            "4000",
            "--ignore-eos",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&copy)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Never killed by the signal: either it finished first, or one clear line and exit 1.
    match out.status.code() {
        Some(0) => {}
        Some(1) => assert!(err.contains("truncated or changed"), "{err}"),
        other => panic!("exit {other:?}: {err}"),
    }
}

/// A writer killed mid-file (`SIGKILL`: nothing can clean up) leaves no file behind: outputs
/// are written unnamed and named only when complete (`pi2_convert::write_atomic`).
#[cfg(target_os = "linux")]
#[test]
fn a_killed_writer_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("big.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pi2"))
        .args(["synth", "--shape", "llama2-7b", "--tokenizer"])
        .arg(common::model())
        .arg("-o")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill once it has written 64 MiB of the file (its write count, from /proc).
    let written = |pid: u32| -> u64 {
        let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
        io.lines()
            .find_map(|l| l.strip_prefix("wchar: "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let t0 = std::time::Instant::now();
    while written(child.id()) < 64 << 20 {
        assert!(t0.elapsed().as_secs() < 120, "synth wrote too little");
        assert!(child.try_wait().unwrap().is_none(), "synth ended early");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
