//! llama.cpp's prompt conventions: special tokens parsed in prompts (unless
//! `--no-parse-special`), prompts from a file or standard input, min-p, llama.cpp-only flags
//! refused in one line, and a word when the context fills. Needs `cargo xtask fetch-model`.

mod common;

use common::{fails_with, m, ok, pi2, pi2_with_stdin};
use serde_json::Value;

fn prompt_ids(args: &[&str]) -> Vec<u64> {
    let out: Value = serde_json::from_str(&ok(args)).unwrap();
    out["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn run_parses_special_tokens_in_prompts_unless_told_not_to() {
    let p = "<|im_start|>user\nHi<|im_end|>\n";
    let args = [
        "run",
        "-m",
        &m(),
        "-p",
        p,
        "-n",
        "1",
        "--temp",
        "0",
        "--json",
    ];
    let ids = prompt_ids(&args);
    // The same ids `pi2 tokenize` gives (it parses special tokens by default), with BOS.
    let tok: Vec<u64> = serde_json::from_str(&ok(&["tokenize", "-m", &m(), p])).unwrap();
    assert_eq!(ids, tok);
    assert!(ids.contains(&1) && ids.contains(&2), "{ids:?}");
    let mut plain = args.to_vec();
    plain.push("--no-parse-special");
    let ids = prompt_ids(&plain);
    assert!(!ids[1..].contains(&1) && !ids.contains(&2), "{ids:?}");
}

#[test]
fn run_reads_the_prompt_from_a_file_or_standard_input() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("prompt.txt");
    std::fs::write(&f, "The capital of France is").unwrap();
    let base = ["-n", "4", "--temp", "0", "--json"];
    let by_p = prompt_ids(
        &[
            &["run", "-m", &m(), "-p", "The capital of France is"][..],
            &base,
        ]
        .concat(),
    );
    let by_f = prompt_ids(&[&["run", "-m", &m(), "-f", f.to_str().unwrap()][..], &base].concat());
    assert_eq!(by_p, by_f);
    let model = m();
    let stdin_args = [&["run", "-m", &model, "-f", "-"][..], &base].concat();
    let out = pi2_with_stdin(&stdin_args, b"The capital of France is");
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let by_stdin: Vec<u64> = v["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(by_p, by_stdin);
    // Refusals: no prompt, both, a missing file, a folder, bytes that are not UTF-8.
    fails_with(&["run", "-m", &m()], "no prompt");
    fails_with(
        &["run", "-m", &m(), "-f", "/nonexistent/p.txt"],
        "cannot read the prompt file",
    );
    fails_with(
        &["run", "-m", &m(), "-f", dir.path().to_str().unwrap()],
        "not a regular file",
    );
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, [b'a', 0xff, 0xfe]).unwrap();
    fails_with(
        &["run", "-m", &m(), "-f", bad.to_str().unwrap()],
        "not UTF-8",
    );
    let both = pi2(&["run", "-m", &m(), "-p", "x", "-f", f.to_str().unwrap()]);
    assert_eq!(both.status.code(), Some(2), "clap refuses -p with -f");
}

#[test]
fn sampling_options_are_checked() {
    for (flag, v) in [
        ("--min-p", "1.5"),
        ("--top-p", "0"),
        ("--temp", "nan"),
        ("--repeat-penalty", "0"),
    ] {
        fails_with(&["run", "-m", &m(), "-p", "x", flag, v], flag);
    }
    // min-p 1 keeps only the top token: the same text as greedy.
    let text = |extra: &[&str]| -> String {
        let out: Value = serde_json::from_str(&ok(&[
            &[
                "run",
                "-m",
                &m(),
                "-p",
                "Once upon a time",
                "-n",
                "12",
                "--json",
            ][..],
            extra,
        ]
        .concat()))
        .unwrap();
        out["text"].as_str().unwrap().to_string()
    };
    assert_eq!(
        text(&["--temp", "0.9", "--min-p", "1", "-s", "3"]),
        text(&["--temp", "0"])
    );
}

#[test]
fn llama_cpp_only_flags_are_refused_in_one_line() {
    for flag in [
        "-ngl",
        "--n-gpu-layers",
        "-hf",
        "--hf-repo=org/model",
        "-fa",
        "-cnv",
        "-ctk",
        "--reranking",
        "--lora",
        "-gan",
    ] {
        let out = pi2(&["run", "-m", &m(), "-p", "x", flag, "1"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert_eq!(err.lines().count(), 1, "{flag}: {err}");
        assert!(
            err.contains("llama.cpp option that pi2 does not support"),
            "{flag}: {err}"
        );
    }
}

#[test]
fn run_says_when_the_context_is_full() {
    let out = pi2(&[
        "run",
        "-m",
        &m(),
        "-p",
        "Once upon a time",
        "-n",
        "-1",
        "-c",
        "16",
        "--temp",
        "0",
        "--ignore-eos",
    ]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("context of 16 tokens is full"), "{err}");
}
