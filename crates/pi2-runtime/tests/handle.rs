//! Owned handles as the C API and the Python package use them: a model opened by path, sessions
//! that generate streamed text (stop strings, cancelling, prefix reuse) exactly as an engine
//! made by hand, and one session per model under a memory budget.

mod common;
use common::*;
use pi2_engine::{generate, GenerateConfig, Sampler, SamplerConfig};
use pi2_model::Model;
use pi2_runtime::handle::{Finish, LoadedModel, Session, TextRequest};
use pi2_runtime::SessionOptions;

fn greedy(max: usize) -> TextRequest {
    TextRequest {
        sampler: SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        max_tokens: Some(max),
        ignore_eos: true,
        ..TextRequest::default()
    }
}

#[test]
fn sessions_stream_the_text_an_engine_generates() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = model_files(dir.path());
    let lm = LoadedModel::open(Some(&src), &options(), &mut |_| {}).unwrap();
    // By hand: the engine's own generation, decoded.
    let m = Model::load(&src).unwrap();
    let mut e = pi2_engine::Engine::new(&m, &options().engine.config().unwrap()).unwrap();
    let cfg = GenerateConfig {
        max_tokens: Some(12),
        ignore_eos: true,
        ..Default::default()
    };
    let mut sampler = Sampler::new(greedy(12).sampler);
    let g = generate(&mut e, &mut sampler, &mut Vec::new(), &TOKENS, &cfg, |_| {
        true
    })
    .unwrap();
    let want = String::from_utf8_lossy(&m.tokenizer.decode(&g.tokens, false)).into_owned();

    let mut s = Session::new(lm.clone()).unwrap();
    let mut text = String::new();
    let out = s
        .generate(&TOKENS, &greedy(12), &mut |t| {
            text.push_str(t);
            true
        })
        .unwrap();
    assert_eq!(out.generation.tokens, g.tokens);
    assert_eq!(text, want);
    assert_eq!(out.finish, Finish::Length);
    let st = s.stats().unwrap();
    assert_eq!(st.generated_tokens, 12);
    assert_eq!(st.bytes_read_per_token, 0.0);
    // The same prompt again reuses the cache: only its last token is evaluated.
    let again = s.generate(&TOKENS, &greedy(12), &mut |_| true).unwrap();
    assert_eq!(again.generation.tokens, g.tokens);
    assert_eq!(again.generation.prompt_n, 1);
    // A callback that says stop cancels after its first piece.
    let mut pieces = 0;
    let c = s
        .generate(&TOKENS, &greedy(12), &mut |_| {
            pieces += 1;
            false
        })
        .unwrap();
    assert_eq!((c.finish, pieces), (Finish::Cancelled, 1));
    // In memory a model holds several sessions, each with its own cache.
    let mut s2 = Session::new(lm.clone()).unwrap();
    let other = s2.generate(&TOKENS, &greedy(12), &mut |_| true).unwrap();
    assert_eq!(other.generation.tokens, g.tokens);
    assert_eq!(lm.sessions(), 2);
    drop(s2);
    assert_eq!(lm.sessions(), 1);
    // A too-long prompt and a bad temperature are refused by name.
    let long = vec![5u32; s.n_ctx()];
    let e = s.generate(&long, &greedy(1), &mut |_| true).unwrap_err();
    assert!(e.to_string().contains("longer than the context"), "{e}");
    let mut bad = greedy(1);
    bad.sampler.temperature = -1.0;
    let e = s.generate(&TOKENS, &bad, &mut |_| true).unwrap_err();
    assert!(e.to_string().starts_with("temperature"), "{e}");
}

#[test]
fn stop_strings_end_the_text_before_them() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = model_files(dir.path());
    let lm = LoadedModel::open(Some(&src), &options(), &mut |_| {}).unwrap();
    let mut s = Session::new(lm).unwrap();
    let mut whole = String::new();
    s.generate(&TOKENS, &greedy(12), &mut |t| {
        whole.push_str(t);
        true
    })
    .unwrap();
    // A stop string from the middle of the text the model writes.
    let chars: Vec<char> = whole.chars().collect();
    assert!(chars.len() >= 4, "{whole:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let before = &whole[..whole.find(&stop).unwrap()];
    let mut req = greedy(12);
    req.stops = vec![stop];
    let mut text = String::new();
    let out = s
        .generate(&TOKENS, &req, &mut |t| {
            text.push_str(t);
            true
        })
        .unwrap();
    assert_eq!(text, before);
    assert_eq!(out.finish, Finish::Stop);
}

/// A control token shows as nothing unless the request lists it among its shown tokens (a chat
/// dialect's markers, which its answers are read back by).
#[test]
fn listed_control_tokens_are_shown() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = model_files(dir.path());
    let lm = LoadedModel::open(Some(&src), &options(), &mut |_| {}).unwrap();
    let open = Model::load(&src)
        .unwrap()
        .tokenizer
        .token_id("<|im_start|>")
        .unwrap();
    let mut s = Session::new(lm).unwrap();
    let mut text_of = |shown: Vec<u32>| {
        let mut req = greedy(2);
        req.sampler.logit_bias = vec![(open, 100.0)];
        req.shown_tokens = shown;
        let mut text = String::new();
        let out = s
            .generate(&TOKENS, &req, &mut |t| {
                text.push_str(t);
                true
            })
            .unwrap();
        assert_eq!(out.generation.tokens, vec![open, open]);
        text
    };
    assert_eq!(text_of(vec![]), "");
    assert_eq!(text_of(vec![open]), "<|im_start|><|im_start|>");
}

#[test]
fn a_budget_holds_one_session() {
    let dir = tempfile::tempdir().unwrap();
    let (_, conv) = model_files(dir.path());
    let cm = Model::load(&conv).unwrap();
    let mut o = options();
    // The process's memory as measured once, and a budget of it and most of the file.
    let process = pi2_runtime::offload::process_bytes(&cm);
    o.offload.process_bytes = Some(process);
    let opts = SessionOptions {
        mem_budget: Some(format!(
            "{}K",
            (process + cm.file.file_size() * 9 / 10) >> 10
        )),
        ..o
    };
    let lm = LoadedModel::open(Some(&conv), &opts, &mut |_| {}).unwrap();
    assert!(lm.prepared().offloads());
    let mut s = Session::new(lm.clone()).unwrap();
    let e = Session::new(lm.clone()).err().unwrap();
    assert!(e.to_string().contains("one session"), "{e}");
    let out = s.generate(&TOKENS, &greedy(4), &mut |_| true).unwrap();
    assert_eq!(out.generation.tokens.len(), 4);
    assert!(s.stats().unwrap().bytes_read_per_token > 0.0);
    // Closing it makes room for the next.
    drop(s);
    Session::new(lm).unwrap();
}
