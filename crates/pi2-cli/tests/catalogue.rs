//! Catalogue names load verified files: a fetched model whose bytes changed (same size, same
//! modification time) or a file of garbage under its name is refused in one line and listed as
//! corrupt; partial files of killed fetches are cleaned; and the option edge cases of a run
//! (a negative count, a budget of bytes, a non-UTF-8 chat line) get clear answers.

mod common;

use common::{fails_with, m, model, root};
use std::io::{Seek, SeekFrom, Write};
use std::process::{Command, Output, Stdio};

/// `pi2 args` with the models and cache folders given.
fn pi2_in(dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pi2"))
        .args(args)
        .env("PI2_MODELS_DIR", dir.join("models"))
        .env("PI2_CACHE_DIR", dir.join("cache"))
        .current_dir(root())
        .output()
        .unwrap()
}

#[test]
fn catalogue_files_are_verified_before_they_run() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    let file = models.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    std::fs::copy(model(), &file).unwrap();
    // A killed fetch's leftover (no process has this id).
    let part = models.join(".SmolLM2-135M-Instruct.Q4_1.gguf.4000000000.part");
    std::fs::write(&part, b"half").unwrap();
    let args = ["tokenize", "-m", "smollm2-135m", "Hello world"];
    let out = pi2_in(dir.path(), &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!part.exists(), "the stale partial file is still there");

    // 16 bytes overwritten in the middle, size and modification time kept.
    let mtime = std::fs::metadata(&file).unwrap().modified().unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.seek(SeekFrom::Start(50 << 20)).unwrap();
    f.write_all(&[0x5a; 16]).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    let out = pi2_in(dir.path(), &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("corrupt or was replaced") && err.contains("--force"),
        "{err}"
    );

    // Eight bytes of garbage under another model's name.
    std::fs::write(
        models.join("Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf"),
        b"garbage!",
    )
    .unwrap();
    let out = pi2_in(dir.path(), &["fetch-model", "--list"]);
    let list = String::from_utf8_lossy(&out.stdout);
    assert_eq!(list.matches("CORRUPT").count(), 2, "{list}");
}

#[test]
fn run_options_at_their_edges_get_clear_answers() {
    fails_with(
        &["run", "-m", &m(), "-p", "hi", "-n", "-5"],
        "-1 for until end",
    );
    fails_with(
        &["run", "-m", &m(), "-p", "hi", "--mem-budget", "1"],
        "1 bytes is too small",
    );
    // A budget the whole model fits in says so and runs in memory.
    let out = common::pi2(&[
        "run",
        "-m",
        &m(),
        "-p",
        "hi",
        "-n",
        "1",
        "--mem-budget",
        "99999G",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.contains("no budget applies"),
        "{err}"
    );
    // A line that is not UTF-8 is skipped with a note; the chat goes on.
    let mut child = Command::new(env!("CARGO_BIN_EXE_pi2"))
        .args(["chat", "-m", &m(), "-n", "2", "--temp", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hi\xff\xfe\nhello\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("not UTF-8 text"), "{err}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "no answer to the second line"
    );
}

/// A catalogue file already verified in the user's models folder is taken from there when
/// another folder asks for it (`cargo xtask fetch-model` fills the repository's `models/`),
/// never downloaded again.
#[test]
fn a_model_in_the_users_folder_is_not_downloaded_again() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::copy(model(), models.join("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let other = dir.path().join("repo-models");
    let out = pi2_in(
        dir.path(),
        &[
            "fetch-model",
            "smollm2-135m",
            "--dir",
            other.to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("not downloaded again"), "{err}");
    let got = std::fs::read(other.join("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    assert_eq!(got, std::fs::read(model()).unwrap());
}
