//! `pi2 run --draft lookup`: speculative decoding from the command line gives the same greedy
//! text as plain decode on the dense model, with fewer forward passes than tokens on an answer
//! that repeats its prompt; under a memory budget it computes what in-memory sparse decode with
//! drafts computes, token for token, reading fewer bytes per token than plain decode; absurd
//! lengths are refused in one line. (A sparse model's checked batch agrees with its one-token
//! steps to rounding, not bit for bit: `crates/pi2-engine/tests/draft.rs`.)

mod common;

use common::{fails_with, m, ok};
use serde_json::Value;

/// A prompt whose continuation repeats it: a list the model is asked to copy.
fn editing_prompt() -> String {
    let items: Vec<String> = (1..=30)
        .map(|i| format!("item {i}: value {}", i * 7))
        .collect();
    format!(
        "<|im_start|>user\nCopy this list exactly:\n{}\n<|im_end|>\n<|im_start|>assistant\n{}\n",
        items.join("\n"),
        items[0]
    )
}

fn run(model: &str, draft: &str, extra: &[&str]) -> Value {
    let prompt = editing_prompt();
    let mut args = vec![
        "run", "-m", model, "-p", &prompt, "-n", "48", "--temp", "0", "--json", "--draft", draft,
        "-t", "2",
    ];
    args.extend_from_slice(extra);
    serde_json::from_str(&ok(&args)).unwrap()
}

#[test]
fn lookup_drafts_give_the_same_greedy_text_in_fewer_passes() {
    let plain = run(&m(), "none", &[]);
    let drafted = run(&m(), "lookup", &[]);
    assert_eq!(plain["generated_ids"], drafted["generated_ids"]);
    assert!(plain["draft"].is_null());
    let d = &drafted["draft"];
    assert!(d["accepted"].as_u64().unwrap() > 10, "{d}");
    assert!(d["tokens_per_pass"].as_f64().unwrap() > 1.5, "{d}");
    for (lengths, option) in [
        (&["--draft-max", "0"][..], "--draft-max"),
        (&["--draft-min", "9", "--draft-max", "4"][..], "--draft-min"),
    ] {
        let model = m();
        let mut args = vec!["run", "-m", &model, "-p", "x", "--draft", "lookup"];
        args.extend_from_slice(lengths);
        fails_with(&args, option);
    }
}

#[test]
fn under_a_memory_budget_drafts_compute_as_in_memory_and_read_less_per_token() {
    let dir = tempfile::tempdir().unwrap();
    let conv = common::small_conversion(dir.path());
    let budget = ["--mem-budget", "60%", "-c", "1024"];
    let plain = run(&conv, "none", &budget);
    let drafted = run(&conv, "lookup", &budget);
    let in_memory = run(&conv, "lookup", &["--sparse", "-c", "1024"]);
    assert_eq!(drafted["generated_ids"], in_memory["generated_ids"]);
    assert!(drafted["draft"]["accepted"].as_u64().unwrap() > 0);
    let bytes = |v: &Value| v["bytes_read_per_token"]["total"].as_f64().unwrap();
    assert!(bytes(&plain) > 0.0);
    assert!(
        bytes(&drafted) < bytes(&plain),
        "{} vs {}",
        bytes(&drafted),
        bytes(&plain)
    );
}

/// `--draft self`: under a budget, drafts from what is resident are checked into plain decode's
/// greedy tokens; without a budget it is refused in one line, as is a second draft source.
#[test]
fn self_drafts_under_a_budget_keep_the_tokens_and_are_refused_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let conv = common::small_conversion(dir.path());
    let budget = ["--mem-budget", "90%", "-c", "1024"];
    let drafted = run(&conv, "self", &budget);
    let plain = run(&conv, "none", &budget);
    let d = &drafted["draft"];
    assert!(d["drafted"].as_u64().unwrap() > 0, "{d}");
    assert_eq!(drafted["generated_ids"], plain["generated_ids"]);
    fails_with(
        &["run", "-m", &m(), "-p", "x", "--draft", "self"],
        "--draft self drafts from what --mem-budget keeps resident",
    );
    let model = m();
    fails_with(
        &[
            "run",
            "-m",
            &model,
            "-p",
            "x",
            "--draft",
            "self",
            "--draft-model",
            &model,
        ],
        "two draft sources",
    );
}

/// `--draft-model`: the same greedy text as plain decode; the model as its own draft has every
/// draft kept; another vocabulary, two draft sources, or a draft that leaves the budget nothing
/// are refused in one line.
#[test]
fn a_draft_model_gives_the_same_greedy_text() {
    let model = m();
    let plain = run(&model, "none", &[]);
    let drafted = run(&model, "none", &["--draft-model", &model]);
    assert_eq!(plain["generated_ids"], drafted["generated_ids"]);
    let d = &drafted["draft"];
    assert!(d["drafted"].as_u64().unwrap() > 0, "{d}");
    assert_eq!(d["accepted"], d["drafted"], "{d}");
    let qwen = common::root().join("models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf");
    let base = ["run", "-m", model.as_str(), "-p", "x", "-n", "2"];
    fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [base, extra].concat()
    }
    fails_with(
        &with(&base, &["--draft-model", qwen.to_str().unwrap()]),
        "needs the same vocabulary",
    );
    fails_with(
        &with(&base, &["--draft-model", &model, "--draft", "lookup"]),
        "give one",
    );
    fails_with(
        &with(&base, &["--draft-model", &model, "--mem-budget", "20M"]),
        "leaves nothing for the model",
    );
}

/// `chat` drafts too: the same replies with a draft model or prompt lookup as without drafts.
#[test]
fn chat_replies_are_the_same_with_drafts() {
    let model = m();
    let chat = |extra: &[&str]| {
        let mut args = vec![
            "chat",
            "-m",
            model.as_str(),
            "--temp",
            "0",
            "-n",
            "24",
            "-t",
            "2",
        ];
        args.extend_from_slice(extra);
        let out = common::pi2_with_stdin(&args, b"What is the capital of France?\nAnd of Italy?\n");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let plain = chat(&[]);
    assert!(plain.lines().count() >= 2, "{plain}");
    assert_eq!(chat(&["--draft-model", &model]), plain);
    assert_eq!(chat(&["--draft", "lookup"]), plain);
}
