//! llama.cpp's own tokenizer tests (`ggml-vocab-NAME.gguf` with `.inp` texts and `.out` ids, as
//! its `test-tokenizer-0` runs them: no BOS, control text not parsed; the ids decode back to the
//! text), fetched into
//! `models/llama-vocab/` by `cargo xtask fetch-model` from the llama-cpp-python sdist on PyPI.

use pi2_model::{GgufFile, ModelError, Tokenizer};
use std::path::PathBuf;

/// Vocabulary kinds pi2 does not implement: loading them must say so.
const UNSUPPORTED_MODELS: [&str; 1] = ["bert"];
const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

#[test]
fn llama_cpp_vocab_tests_pass() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/llama-vocab");
    assert!(
        dir.join("SOURCE").exists(),
        "llama.cpp's tokenizer tests are missing in {}: run `cargo xtask fetch-model` first",
        dir.display()
    );
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".gguf.inp"))
        .collect();
    inputs.sort();
    let (mut passed, mut failures) = (Vec::new(), Vec::new());
    for inp in inputs {
        let vocab = PathBuf::from(inp.to_string_lossy().trim_end_matches(".inp"));
        let name = vocab.file_name().unwrap().to_string_lossy().into_owned();
        let file = GgufFile::open(&vocab).unwrap();
        let kind = file
            .get("tokenizer.ggml.model")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        let tok = match Tokenizer::from_gguf(&file) {
            Ok(t) => t,
            Err(ModelError::Tokenizer(msg)) if UNSUPPORTED_MODELS.contains(&kind.as_str()) => {
                assert!(msg.contains("unsupported tokenizer model"), "{name}: {msg}");
                eprintln!("{name}: not supported ({msg})");
                continue;
            }
            Err(e) => panic!("{name} ({kind}): {e}"),
        };
        let texts = std::fs::read_to_string(&inp).unwrap();
        let ids = std::fs::read_to_string(vocab.with_extension("gguf.out")).unwrap();
        // Every text ends with the separator.
        let texts: Vec<&str> = texts
            .strip_suffix(SEPARATOR)
            .unwrap_or(&texts)
            .split(SEPARATOR)
            .collect();
        let ids: Vec<&str> = ids.lines().collect();
        assert_eq!(texts.len(), ids.len(), "{name}: inputs and outputs");
        for (text, want) in texts.iter().zip(&ids) {
            let want: Vec<u32> = want
                .split_whitespace()
                .map(|x| x.parse().unwrap())
                .collect();
            let got = tok.encode(text, false, false);
            if got != want {
                failures.push(format!("{name} {text:?}: got {got:?}, want {want:?}"));
            }
            let back = String::from_utf8_lossy(&tok.decode(&got, false)).into_owned();
            if back != *text {
                failures.push(format!("{name} {text:?}: decodes to {back:?}"));
            }
        }
        eprintln!("{name}: {} cases", texts.len());
        passed.push(name);
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The BPE pre-tokenizers and SentencePiece vocabularies of the test set, every one checked.
    for want in [
        "llama-spm",
        "llama-bpe",
        "phi-3",
        "gpt-2",
        "qwen2",
        "qwen35",
        "gemma-4",
        "deepseek-llm",
        "deepseek-coder",
        "falcon",
        "mpt",
        "starcoder",
        "refact",
        "command-r",
    ] {
        assert!(
            passed
                .iter()
                .any(|p| p == &format!("ggml-vocab-{want}.gguf")),
            "{want} was not tested"
        );
    }
}

/// llama.cpp's collection of 70 chat templates (`models/templates/`, fetched with the
/// vocabularies): each renders a system-user-assistant-user conversation with the last message
/// in it, or stops with a template error, never a panic. Two fail on purpose: Gemma 2's refuses
/// a system message (its own `raise_exception`) and FireFunction v2's needs a `datetime`
/// variable only llama.cpp's own handler for it passes.
#[test]
fn llama_cpp_chat_templates_render() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/llama-vocab/templates");
    assert!(
        dir.exists(),
        "llama.cpp's chat templates are missing in {}: run `cargo xtask fetch-model` first",
        dir.display()
    );
    let msgs = [
        pi2_model::Message::new("system", "You are terse."),
        pi2_model::Message::new("user", "Hello there"),
        pi2_model::Message::new("assistant", "Hi."),
        pi2_model::Message::new("user", "What is 2+2?"),
    ];
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    let mut failed = Vec::new();
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let src = std::fs::read_to_string(f).unwrap();
        match pi2_model::ChatTemplate::new(&src, "<s>", "</s>").and_then(|t| t.render(&msgs, true))
        {
            Ok(text) => assert!(text.contains("What is 2+2?"), "{name}: {text:?}"),
            Err(e) => {
                assert!(matches!(e, ModelError::Template(_)), "{name}: {e}");
                failed.push(name);
            }
        }
    }
    eprintln!(
        "{} of {} templates render",
        files.len() - failed.len(),
        files.len()
    );
    assert_eq!(files.len(), 70);
    assert_eq!(
        failed,
        [
            "fireworks-ai-llama-3-firefunction-v2.jinja",
            "google-gemma-2-2b-it.jinja"
        ]
    );
}

/// llama.cpp's `gpt-4o` pre-tokenizer (gpt-oss, Llama 4): the gpt-2 test vocabulary with its
/// pre-tokenizer named `gpt-4o`, on llama.cpp's own test texts and a few of cased and other
/// scripts; the ids llama.cpp gave are in `testdata/tokenizer/gpt-4o.json`.
#[test]
fn the_gpt_4o_pre_tokenizer_splits_as_llama_cpp_does() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut file = GgufFile::open(root.join("models/llama-vocab/ggml-vocab-gpt-2.gguf")).unwrap();
    let pre = (file.metadata.iter())
        .position(|(k, _)| k == "tokenizer.ggml.pre")
        .unwrap();
    file.metadata[pre].1 = pi2_model::gguf::Value::String("gpt-4o".into());
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("testdata/tokenizer/gpt-4o.json")).unwrap(),
    )
    .unwrap();
    let mut failures = Vec::new();
    for c in cases["cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        let want: Vec<u32> = (c["ids"].as_array().unwrap().iter())
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(text, false, false);
        if got != want {
            failures.push(format!("{text:?}: got {got:?}, want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
