//! The `pi2` binary end to end: outputs on the real model, and one clear error line (exit code 1,
//! no panic) for every kind of bad input. Needs `cargo xtask fetch-model`.

mod common;

use common::{fails_with, m, model, ok, pi2_with_stdin, root};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

#[test]
fn run_json_reports_ids_text_timings_and_memory() {
    let out = ok(&[
        "run",
        "-m",
        &m(),
        "-p",
        "The capital of France is",
        "-n",
        "8",
        "--temp",
        "0",
        "-t",
        "2",
        "--json",
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["prompt_ids"],
        serde_json::json!([504, 3575, 282, 4649, 314])
    );
    // llama.cpp's greedy ids, up to its first step with margin < 0.5 (testdata/golden/greedy.json)
    let ids: Vec<u64> = v["generated_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(&ids[..5], &[7042, 30, 198, 198, 504]);
    assert!(v["text"].as_str().unwrap().starts_with(" Paris."));
    let t = &v["timings"];
    assert_eq!(t["prompt_n"], 5);
    assert_eq!(t["predicted_n"], 8);
    for k in ["prompt_ms", "predicted_ms", "predicted_per_second"] {
        assert!(t[k].as_f64().unwrap() > 0.0, "{k}");
    }
    let rss = v["peak_rss_bytes"].as_u64().unwrap();
    assert!(rss > 50 << 20 && rss < 1 << 30, "peak RSS {rss}");
}

#[test]
fn run_streams_text() {
    let out = ok(&[
        "run",
        "-m",
        &m(),
        "-p",
        "The capital of France is",
        "-n",
        "3",
        "--temp",
        "0",
    ]);
    assert!(
        out.starts_with("The capital of France is Paris."),
        "{out:?}"
    );
}

#[test]
fn default_model_comes_from_the_models_folder() {
    let out = Command::new(env!("CARGO_BIN_EXE_pi2"))
        .args(["tokenize", "Hello world"])
        .env("PI2_MODELS_DIR", root().join("models"))
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[19556,905]");
}

#[test]
fn tokenize_parses_special_tokens_unless_told_not_to() {
    assert_eq!(
        ok(&["tokenize", "-m", &m(), "<|im_start|>user"]).trim(),
        "[1,4093]"
    );
    let plain: Vec<u32> = serde_json::from_str(&ok(&[
        "tokenize",
        "-m",
        &m(),
        "--no-parse-special",
        "<|im_start|>user",
    ]))
    .unwrap();
    assert!(plain.len() > 2 && !plain.contains(&1));
}

#[test]
fn info_describes_the_model() {
    let v: Value = serde_json::from_str(&ok(&["info", "-m", &m(), "--json"])).unwrap();
    assert_eq!(v["architecture"], "llama");
    assert_eq!(v["n_layer"], 30);
    assert_eq!(v["n_embd"], 576);
    assert_eq!(v["tensor_types"]["Q4_1"]["count"], 210);
    assert!(
        v["memory"]["total_bytes"].as_u64().unwrap()
            > v["memory"]["weights_bytes"].as_u64().unwrap()
    );
    assert!(!v["cpu"]["clusters"][0]["cpus"]
        .as_array()
        .unwrap()
        .is_empty());
    let text = ok(&["info", "-m", &m()]);
    assert!(text.contains("architecture:  llama") && text.contains("memory needed"));
    assert!(text.contains("cpu cores:     big "));
}

#[test]
fn cores_pin_the_threads_and_set_their_number() {
    // CPU 0 is online everywhere; pinned output is the same greedy text.
    let model = m();
    let run = |extra: &[&str]| -> Value {
        let mut a = vec![
            "run", "-m", &model, "-p", "Hello", "-n", "4", "--temp", "0", "--json",
        ];
        a.extend_from_slice(extra);
        serde_json::from_str(&ok(&a)).unwrap()
    };
    let pinned = run(&["--cores", "0"]);
    assert_eq!(pinned["threads"], 1);
    assert_eq!(pinned["generated_ids"], run(&[])["generated_ids"]);
}

#[test]
fn perplexity_prints_llama_style_output() {
    let out = ok(&[
        "perplexity",
        "-m",
        &m(),
        "-f",
        "testdata/corpus/kjv_genesis.txt",
        "-c",
        "128",
        "--chunks",
        "2",
    ]);
    assert!(out.starts_with("[1]"), "{out}");
    let last = out.lines().last().unwrap();
    assert!(
        last.starts_with("Final estimate: PPL = ") && last.contains(" +/- "),
        "{last}"
    );
}

#[test]
fn chat_answers_and_exits() {
    let out = pi2_with_stdin(
        &["chat", "-m", &m(), "--temp", "0", "-n", "12"],
        b"What is the capital of France?\nAnd of Italy?\n/exit\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.trim().is_empty(), "no reply");
    // One prompt per line read: two questions and the /exit.
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).matches("> ").count(),
        3
    );
}

#[test]
fn chat_context_shift_drops_the_oldest_turns() {
    let turns = b"Tell me about Paris in detail.\nAnd about Rome?\nAnd about Madrid?\nAnd about Berlin?\n/exit\n";
    let args = [
        "chat",
        "-m",
        &m(),
        "--temp",
        "0",
        "-n",
        "40",
        "-c",
        "160",
        "--system",
        "Be brief.",
    ];
    let mut shifted = args.to_vec();
    shifted.push("--context-shift");
    let out = pi2_with_stdin(&shifted, turns);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("(context shift: dropped the 2 oldest turns)"),
        "{err}"
    );
    // Every message was answered: none refused, a prompt for each line read.
    assert!(!err.contains("no longer fits"), "{err}");
    assert_eq!(err.matches("> ").count(), 5, "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).trim().is_empty());
}

#[test]
fn run_chat_prints_the_reply_alone() {
    // A plain prompt is continued (printed first); a chat prompt is answered (not printed).
    let q = "What is the capital of France?";
    let plain = ok(&["run", "-m", &m(), "-p", q, "-n", "4", "--temp", "0"]);
    assert!(plain.starts_with(q), "{plain:?}");
    let chat = ok(&[
        "run",
        "-m",
        &m(),
        "--chat",
        "-p",
        q,
        "-n",
        "4",
        "--temp",
        "0",
    ]);
    assert!(!chat.contains(q) && !chat.trim().is_empty(), "{chat:?}");
}

/// `--chat-template` and `--chat-template-file` replace the model's template (llama-server's
/// options): a format by name, a Jinja text, a file; an unknown name, a template that does not
/// compile, or either without `--chat` is refused by name.
#[test]
fn a_chat_template_given_replaces_the_models() {
    let model = m();
    let prompt_ids = |extra: &[&str]| -> Value {
        let mut args = vec![
            "run", "-m", &model, "--chat", "-p", "Hello", "-n", "1", "--json",
        ];
        args.extend_from_slice(extra);
        serde_json::from_str::<Value>(&ok(&args)).unwrap()["prompt_ids"].clone()
    };
    let tokens = |text: &str| -> Value {
        serde_json::from_str(ok(&["tokenize", "-m", &model, text]).trim()).unwrap()
    };
    let own = prompt_ids(&[]);
    let chatml = prompt_ids(&["--chat-template", "chatml"]);
    assert_ne!(own, chatml, "the model's own template adds a system prompt");
    assert_eq!(
        chatml,
        tokens("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")
    );
    let jinja = "{{ messages[0]['content'] }}!";
    assert_eq!(prompt_ids(&["--chat-template", jinja]), tokens("Hello!"));
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "t.jinja", b"[{{ messages[0]['content'] }}]");
    assert_eq!(
        prompt_ids(&["--chat-template-file", &file]),
        tokens("[Hello]")
    );
    let run = ["run", "-m", &model, "--chat", "-p", "Hi", "-n", "1"];
    fails_with(
        &[&run[..], &["--chat-template", "vicuna"]].concat(),
        "chatml, llama3, gemma, phi3",
    );
    fails_with(
        &[&run[..], &["--chat-template", "{% if %}"]].concat(),
        "--chat-template: the template does not compile",
    );
    fails_with(
        &[
            "run",
            "-m",
            &model,
            "-p",
            "Hi",
            "-n",
            "1",
            "--chat-template",
            "chatml",
        ],
        "add --chat",
    );
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.display().to_string()
}

#[test]
fn bad_input_gives_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fails_with(
        &["info", "-m", "/nonexistent/model.gguf"],
        "/nonexistent/model.gguf",
    );
    fails_with(&["info", "-m", &d.display().to_string()], "is a directory");
    fails_with(
        &[
            "info",
            "-m",
            &root().join("README.md").display().to_string(),
        ],
        "not a GGUF file",
    );
    fails_with(
        &["info", "-m", &write(d, "empty.gguf", b"")],
        "not a GGUF file",
    );

    let real = std::fs::read(model()).unwrap();
    for cut in [10usize, 5000, 2_000_000, real.len() - 100] {
        fails_with(
            &["run", "-m", &write(d, "cut.gguf", &real[..cut]), "-p", "x"],
            "truncated",
        );
    }
    let mut flipped = real.clone();
    flipped[5] = 0x7f; // version
    fails_with(
        &["info", "-m", &write(d, "v.gguf", &flipped)],
        "unsupported GGUF version",
    );

    let other = pi2_model::synth::build(&pi2_model::synth::SynthSpec {
        arch: "mamba".into(),
        ..Default::default()
    });
    fails_with(
        &["info", "-m", &write(d, "mamba.gguf", &other.to_bytes())],
        "unsupported architecture `mamba`",
    );

    let long = "word ".repeat(40);
    fails_with(
        &["run", "-m", &m(), "-c", "16", "-p", &long],
        "longer than the context",
    );
    fails_with(
        &["run", "-m", &m(), "--kernel-tier", "sse9", "-p", "x"],
        "unknown tier `sse9`",
    );
    fails_with(&["run", "-m", &m(), "-t", "0", "-p", "x"], "--threads");
    fails_with(
        &["run", "-m", &m(), "--cores", "9999", "-p", "x"],
        "CPU 9999 is not online",
    );
    fails_with(
        &["run", "-m", &m(), "--cores", "fast", "-p", "x"],
        "bad core selection `fast`",
    );
    fails_with(
        &["perplexity", "-m", &m(), "-f", "/nonexistent.txt"],
        "/nonexistent.txt",
    );
    fails_with(
        &[
            "perplexity",
            "-m",
            &m(),
            "-f",
            &write(d, "short.txt", b"too short"),
            "-c",
            "512",
        ],
        "at least 1024 tokens",
    );
}

#[test]
fn fetch_never_overwrites_a_different_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        b"my own file",
    );
    fails_with(
        &["fetch-model", "--dir", &dir.path().display().to_string()],
        "--force",
    );
    assert_eq!(std::fs::read(&p).unwrap(), b"my own file");
}

#[test]
fn profile_writes_profile_trace_and_pictures_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let out_s = out.display().to_string();
    let corpus = root().join("testdata/corpus/kjv_calibration.txt");
    let corpus_s = corpus.display().to_string();
    let args = [
        "profile",
        "-m",
        &m(),
        "-f",
        &corpus_s,
        "--tokens",
        "64",
        "--chunk",
        "32",
        "-o",
        &out_s,
    ];
    let table = ok(&args);
    assert!(table.starts_with("layer | threshold@50%"), "{table}");
    let prof = pi2_sparse::Profile::load(&out).unwrap();
    assert_eq!(prof.layers.len(), 30);
    assert_eq!(prof.calibration.tokens, 64);
    let l = &prof.layers[3];
    // Half of all (token, neuron) scores are below the reference threshold.
    let mean_freq: f32 = l.frequency.iter().sum::<f32>() / l.frequency.len() as f32;
    assert!((mean_freq - 0.5).abs() < 0.05, "{mean_freq}");
    let trace = pi2_sparse::Trace::read(&dir.path().join("p.trace")).unwrap();
    assert_eq!((trace.n_layer, trace.n_ff, trace.n_tokens), (30, 1536, 64));
    for pic in ["p-hotness.svg", "p-hitrate.svg"] {
        let svg = std::fs::read_to_string(dir.path().join(pic)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("<polyline"),
            "{pic}"
        );
    }
    fails_with(&args, "exists; pass --force");
    let mut bad = args.to_vec();
    bad.extend(["--force", "--sparsity", "1.5"]);
    fails_with(&bad, "--sparsity must be in 0..1");
}

/// `pi2` with a private planner cache.
fn pi2_cached(cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pi2"))
        .args(args)
        .current_dir(root())
        .env("PI2_CACHE_DIR", cache)
        .output()
        .expect("run pi2")
}

#[test]
fn plan_profiles_the_device_solves_runs_and_refuses_foreign_plans() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let corpus = root().join("testdata/corpus/kjv_calibration.txt");
    let corpus = corpus.display().to_string();
    let (prof, conv, cache, plan) = (
        p("p.json"),
        p("c.gguf"),
        dir.path().join("cache"),
        p("plan.json"),
    );
    ok(&[
        "profile",
        "-m",
        &m(),
        "-f",
        &corpus,
        "--tokens",
        "64",
        "--chunk",
        "32",
        "-o",
        &prof,
    ]);
    ok(&[
        "convert",
        "-m",
        &m(),
        "--profile",
        &prof,
        "-f",
        &corpus,
        "--tokens",
        "64",
        "--chunk",
        "32",
        "--sparsity",
        "0.3",
        "--predictor",
        "none",
        "--down-type",
        "q8_0",
        "-o",
        &conv,
    ]);
    let run = |args: &[&str]| {
        let out = pi2_cached(&cache, args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!err.contains("panicked"), "pi2 {args:?}: {err}");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            err,
        )
    };
    // A head row type pi2 cannot make is refused before any work, naming the option.
    let unmade = dir.path().join("unmade.gguf");
    let unmade = unmade.to_str().unwrap();
    let (code, _, err) = run(&[
        "convert",
        "-m",
        &m(),
        "--profile",
        &prof,
        "-f",
        &corpus,
        "--tokens",
        "64",
        "--head-type",
        "q6_k",
        "-o",
        unmade,
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--head-type"), "{err}");
    assert!(!std::path::Path::new(unmade).exists());
    // No profile of this device yet: the planner says what to run.
    let (code, _, err) = run(&[
        "plan",
        "-m",
        &conv,
        "-c",
        "64",
        "--mem-limit",
        "100%",
        "--tokens",
        "4",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("pi2 profile-hw"), "{err}");
    let (code, out, err) = run(&[
        "profile-hw",
        "-m",
        &conv,
        "--kernel-ms",
        "4",
        "--read-ms",
        "60",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("hardware profile") && out.contains("flash (pread"),
        "{out}"
    );

    let args = [
        "plan",
        "-m",
        &conv,
        "-c",
        "64",
        "--mem-limit",
        "100%",
        "--tokens",
        "4",
        "--explain",
        "-o",
        &plan,
    ];
    let (code, _, err) = run(&args);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("predicted: decode") && err.contains("predicted decode speed vs memory limit"),
        "{err}"
    );
    let pf: Value = serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    assert_eq!(pf["version"], 1);
    assert!(pf["predicted"]["decode_tps"].as_f64().unwrap() > 0.0);
    // Never written over without --force.
    let (code, _, err) = run(&args);
    assert_eq!(code, Some(1));
    assert!(err.contains("exists; pass --force"), "{err}");
    // A limit below the minimum names it.
    let (code, _, err) = run(&[
        "plan",
        "-m",
        &conv,
        "-c",
        "64",
        "--mem-limit",
        "10%",
        "--tokens",
        "4",
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.lines().last().unwrap().contains("needs at least"),
        "{err}"
    );

    // The plan runs, and says what it predicted.
    let (code, out, err) = run(&[
        "run", "-m", &conv, "--plan", &plan, "-p", "Hello", "-n", "4", "--temp", "0", "--json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let j: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["generated_ids"].as_array().unwrap().len(), 4);
    assert_eq!(j["plan"]["knobs"], pf["knobs"]);
    // Another model: refused; an old plan version: refused.
    fails_with(
        &["run", "-m", &m(), "--plan", &plan, "-p", "Hi", "-n", "1"],
        "made for model",
    );
    let mut old = pf.clone();
    old["version"] = 0.into();
    let old_path = p("old.json");
    std::fs::write(&old_path, old.to_string()).unwrap();
    fails_with(
        &[
            "run", "-m", &conv, "--plan", &old_path, "-p", "Hi", "-n", "1",
        ],
        "plan again",
    );
}

/// `pi2 synth` writes stand-ins that load, run, and fire at the planted rates (read back by
/// `pi2 profile`); it refuses to overwrite and names bad requests.
#[test]
fn synth_plants_activation_statistics_that_profile_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let tok = write(
        dir.path(),
        "tok.gguf",
        &pi2_model::synth::build(&Default::default()).to_bytes(),
    );
    let out = dir.path().join("relu.gguf");
    let o = out.to_str().unwrap();
    ok(&[
        "synth",
        "--shape",
        "tiny",
        "--ffn",
        "relu",
        "--tokenizer",
        &tok,
        "-o",
        o,
    ]);
    let info: Value = serde_json::from_str(&ok(&["info", "-m", o, "--json"])).unwrap();
    assert_eq!(info["ffn_activation"], "reglu");
    assert_eq!(info["n_layer"], 4);
    fails_with(
        &["synth", "--shape", "tiny", "--tokenizer", &tok, "-o", o],
        "exists; pass --force",
    );
    fails_with(
        &[
            "synth",
            "--shape",
            "llama-70b",
            "--tokenizer",
            &tok,
            "-o",
            o,
        ],
        "unknown shape",
    );
    fails_with(
        &[
            "synth",
            "--shape",
            "tiny",
            "--quant",
            "q5_k",
            "--tokenizer",
            &tok,
            "-o",
            o,
            "--force",
        ],
        "stand-ins in Q5_K",
    );
    let q4k = dir.path().join("relu-q4k.gguf");
    ok(&[
        "synth",
        "--shape",
        "tiny",
        "--ffn",
        "relu",
        "--quant",
        "q4_k",
        "--tokenizer",
        &tok,
        "-o",
        q4k.to_str().unwrap(),
    ]);
    let prof = dir.path().join("p.json");
    for file in [o, q4k.to_str().unwrap()] {
        let text = ok(&[
            "profile",
            "-m",
            file,
            "-f",
            "testdata/corpus/kjv_calibration.txt",
            "--tokens",
            "1024",
            "-o",
            prof.to_str().unwrap(),
            "--force",
        ]);
        let rows: Vec<Vec<f64>> = text
            .lines()
            .skip_while(|l| !l.starts_with("planted vs measured"))
            .skip(2)
            .take(4)
            .map(|l| {
                l.split('|')
                    .take(4)
                    .map(|c| c.trim().parse().unwrap())
                    .collect()
            })
            .collect();
        assert_eq!(rows.len(), 4, "{text}");
        for r in rows {
            let (planted, measured, corr) = (r[1], r[2], r[3]);
            assert!((planted - 0.1).abs() < 1e-3, "{file}: {text}");
            assert!((measured - planted).abs() < 0.03, "{file}: {text}");
            assert!(corr > 0.9, "{file}: {text}");
        }
    }
    // A mixture of experts stand-in runs.
    let moe = dir.path().join("moe.gguf");
    let m = moe.to_str().unwrap();
    ok(&[
        "synth",
        "--shape",
        "tiny-moe",
        "--ffn",
        "dreglu",
        "--tokenizer",
        &tok,
        "-o",
        m,
    ]);
    let run: Value = serde_json::from_str(&ok(&[
        "run", "-m", m, "-p", "the", "-n", "4", "--temp", "0", "--json",
    ]))
    .unwrap();
    let n = run["generated_ids"].as_array().map_or(0, |t| t.len());
    assert!((1..=4).contains(&n), "{run}");
    // Its experts' planted rates come out of `profile`, and it converts and runs offloaded
    // with the dense output.
    let text = ok(&[
        "profile",
        "-m",
        m,
        "-f",
        "testdata/corpus/kjv_calibration.txt",
        "--tokens",
        "1024",
        "-o",
        prof.to_str().unwrap(),
        "--force",
    ]);
    let rows: Vec<Vec<f64>> = text
        .lines()
        .skip_while(|l| !l.starts_with("layer | routed share"))
        .skip(1)
        .take(2)
        .map(|l| {
            l.split('|')
                .skip(2)
                .map(|c| c.trim().parse().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(rows.len(), 2, "{text}");
    // Every expert gets a fair part of the tokens (the router's bias is mild).
    for l in text.lines().filter(|l| l.starts_with("    ")).take(2) {
        let lo: f64 = l
            .split('|')
            .nth(1)
            .unwrap()
            .trim()
            .split("..")
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(lo > 0.08, "{text}");
    }
    for r in rows {
        let (measured, planted, corr) = (r[0], r[1], r[2]);
        assert!((planted - 0.1).abs() < 1e-3, "{text}");
        assert!((measured - planted).abs() < 0.03, "{text}");
        assert!(corr > 0.8, "{text}");
    }
    let conv = dir.path().join("moe-conv.gguf");
    let c = conv.to_str().unwrap();
    fails_with(
        &[
            "convert",
            "-m",
            m,
            "-f",
            "testdata/corpus/kjv_calibration.txt",
            "--tokens",
            "256",
            "--predictor",
            "lowrank",
            "-o",
            c,
        ],
        "without predictors",
    );
    ok(&[
        "convert",
        "-m",
        m,
        "-f",
        "testdata/corpus/kjv_calibration.txt",
        "--tokens",
        "256",
        "-o",
        c,
    ]);
    // One greedy run, as every step below makes it.
    let greedy = ["run", "-p", "In the beginning", "-n", "12", "--temp", "0"];
    let run_json = |args: &[&str]| -> Value {
        let mut all = greedy.to_vec();
        all.push("--json");
        all.extend_from_slice(args);
        serde_json::from_str::<Value>(&ok(&all)).unwrap()
    };
    let ids = |args: &[&str]| run_json(args)["generated_ids"].clone();
    let dense = ids(&["-m", m]);
    // The least budget, as the error for a smaller one names it (this process's own memory
    // included): offloaded there, the tokens are the dense ones and the budget bounds the
    // whole process.
    let out = common::pi2(&[&greedy[..], &["-m", c, "--mem-budget", "1M"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    let least = err
        .split("pass --mem-budget ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("{err}"))
        .to_string();
    assert!(err.contains("this process's own memory"), "{err}");
    let v = run_json(&["-m", c, "--mem-budget", &least]);
    assert_eq!(v["generated_ids"], dense);
    let budget = least.trim_end_matches('M').parse::<u64>().unwrap() << 20;
    let peak = v["peak_rss_bytes"].as_u64().unwrap();
    assert!(peak <= budget, "peak RSS {peak} over the budget {budget}");
    assert_eq!(ids(&["-m", m, "--sparse"]), dense);
    // The ablation ladder: one row per mechanism, all offloaded at the same budget.
    let rows: Value = serde_json::from_str(&ok(&[
        "bench",
        "-m",
        c,
        "-p",
        "0",
        "-n",
        "4",
        "-r",
        "1",
        "--mem-budget",
        &least,
        "--ablation",
        "-o",
        "json",
    ]))
    .unwrap();
    let steps: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert!(r["avg_ts"].as_f64().unwrap() > 0.0, "{r}");
            r["ffn"].as_str().unwrap().rsplit(' ').next().unwrap()
        })
        .collect();
    assert_eq!(
        steps,
        ["naive", "+merged", "+cache", "+pipeline", "+depth"],
        "{rows}"
    );
    fails_with(
        &[
            "bench",
            "-m",
            c,
            "-p",
            "0",
            "-n",
            "4",
            "--mem-budget",
            "6M,7M",
            "--ablation",
        ],
        "exactly one --mem-budget",
    );
}

/// An argument that is not UTF-8 is refused in one line (it panicked in the check for
/// llama.cpp-only flags); a FIFO given to `-f` is refused at once instead of waiting for a
/// writer that never comes.
#[test]
fn odd_arguments_and_files_are_refused_without_a_hang() {
    use std::os::unix::ffi::OsStrExt;
    let out = Command::new(env!("CARGO_BIN_EXE_pi2"))
        .args(["run", "-m", &m(), "-p"])
        .arg(std::ffi::OsStr::from_bytes(b"\xff"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!err.contains("panicked") && err.contains("UTF-8"), "{err}");

    // llama.cpp's multi-letter short flags pi2 has under another name.
    fails_with(&["serve", "-m", &m(), "-np", "0"], "--parallel");
    fails_with(&["serve", "-m", &m(), "-np=0"], "--parallel");

    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string naming a path in a fresh directory.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    fails_with(
        &["run", "-m", &m(), "-f", &fifo.display().to_string()],
        "not a regular file",
    );
}

/// A budget below what the conversion it would need can run under is refused before converting
/// (the floor of the converted file is known from the plain one), and `pi2 info` names that
/// least budget and what converting takes.
#[test]
fn a_budget_too_small_for_the_converted_model_costs_no_conversion() {
    let cache = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let out = pi2_cached(
        cache.path(),
        &[
            "run",
            "-m",
            &m(),
            "-p",
            "Hi",
            "-n",
            "2",
            "--mem-budget",
            "46%",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("is too small for this model"), "{err}");
    assert!(!err.contains("converting"), "{err}");
    assert!(
        started.elapsed().as_secs() < 30,
        "took {:?}",
        started.elapsed()
    );
    assert!(!cache.path().join("converted").exists());
    let info = ok(&["info", "-m", &m()]);
    let least = info
        .lines()
        .find_map(|l| l.split("then --mem-budget ").nth(1))
        .unwrap_or_else(|| panic!("{info}"));
    assert!(info.contains("while converting"), "{info}");
    // The same least budget as the refusal names (its figure rounds up to whole MiB).
    let named: f64 = err
        .split("at least ")
        .nth(1)
        .and_then(|r| r.split(" MiB").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    let shown: f64 = least.split(" MiB").next().unwrap().parse().unwrap();
    assert!((named - shown).abs() < 2.0, "{named} vs {shown}");
}
