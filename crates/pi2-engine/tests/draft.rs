//! Speculative decoding: drafts checked in one pass give plain decode's tokens when greedy and
//! its distribution when sampling, whatever the drafts are; the cache is cut back to what was
//! kept, so later steps see the same context.

use pi2_engine::{
    generate, generate_drafted, DraftConfig, Drafter, Engine, EngineConfig, GenerateConfig, Lookup,
    ModelDraft, Sampler, SamplerConfig,
};
use pi2_kernels::QuantType;
use pi2_model::synth::{build, SynthSpec};
use pi2_model::{GgufFile, Model, TokenId};
use std::collections::HashMap;

fn model() -> Model {
    let s = SynthSpec {
        n_embd: 64,
        n_ff: 128,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        weight_type: QuantType::F32,
        embd_type: QuantType::F32,
        ..SynthSpec::default()
    };
    Model::from_file(GgufFile::from_bytes(&build(&s).to_bytes()).unwrap()).unwrap()
}

fn engine(m: &Model) -> Engine<'_> {
    Engine::new(
        m,
        &EngineConfig {
            threads: 1,
            n_ctx: 128,
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

/// Proposes a fixed continuation: right sometimes, wrong sometimes.
struct Fixed(Vec<TokenId>);

impl Drafter for Fixed {
    fn propose(&mut self, _history: &[TokenId], max: usize) -> Vec<TokenId> {
        self.0.iter().copied().take(max).collect()
    }
}

fn cfg(n: usize) -> GenerateConfig {
    GenerateConfig {
        max_tokens: Some(n),
        ignore_eos: true,
        draft: DraftConfig { max: 4, min: 1 },
        ..GenerateConfig::default()
    }
}

const PROMPT: [TokenId; 8] = [5, 17, 42, 5, 17, 42, 5, 17];

#[test]
fn greedy_drafts_give_plain_decodes_tokens() {
    let m = model();
    let mut e = engine(&m);
    let plain = generate(
        &mut e,
        &mut Sampler::new(SamplerConfig::greedy()),
        &mut Vec::new(),
        &PROMPT,
        &cfg(24),
        |_| true,
    )
    .unwrap();
    // The plain answer's own tokens as drafts (all right), shifted ones (all wrong), and
    // prompt lookup.
    let right = plain.tokens.clone();
    let wrong: Vec<TokenId> = right.iter().map(|t| (t + 1) % 50).collect();
    let drafters: Vec<Box<dyn Drafter>> = vec![
        Box::new(Fixed(right)),
        Box::new(Fixed(wrong)),
        Box::new(Lookup::default()),
    ];
    for mut d in drafters {
        let mut e = engine(&m);
        let mut cached = Vec::new();
        let g = generate_drafted(
            &mut e,
            &mut Sampler::new(SamplerConfig::greedy()),
            &mut cached,
            &PROMPT,
            &cfg(24),
            Some(d.as_mut()),
            |_| true,
        )
        .unwrap();
        assert_eq!(g.tokens, plain.tokens);
        assert!(g.drafted > 0);
        // The cache holds the prompt and the tokens run, as `cached` says (a kept draft's
        // last token was run in its pass; a plain step's last one is not run yet).
        assert_eq!(e.n_past(), cached.len());
        let run: Vec<TokenId> = PROMPT.iter().chain(&g.tokens).copied().collect();
        assert_eq!(cached[..], run[..cached.len()]);
        assert!(cached.len() >= run.len() - 1);
    }
}

/// Tokens at positions 1 and 2 over many seeds, with and without drafts: the same
/// distribution (total variation within sampling noise), and not the drafts' own.
#[test]
fn sampled_drafts_keep_plain_decodes_distribution() {
    let m = model();
    let sampler = |seed| {
        Sampler::new(SamplerConfig {
            temperature: 3.0,
            top_k: 6,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            ..SamplerConfig::default()
        })
    };
    let greedy = generate(
        &mut engine(&m),
        &mut Sampler::new(SamplerConfig::greedy()),
        &mut Vec::new(),
        &PROMPT,
        &cfg(3),
        |_| true,
    )
    .unwrap()
    .tokens;
    let n = 6000u64;
    let mut counts: [HashMap<(usize, TokenId), f64>; 2] = Default::default();
    let mut kept = 0;
    for seed in 0..n {
        let mut e = engine(&m);
        let plain = generate(
            &mut e,
            &mut sampler(seed),
            &mut Vec::new(),
            &PROMPT,
            &cfg(3),
            |_| true,
        )
        .unwrap();
        let mut e = engine(&m);
        let mut d = Fixed(greedy.clone());
        let drafted = generate_drafted(
            &mut e,
            &mut sampler(seed + 1_000_000),
            &mut Vec::new(),
            &PROMPT,
            &cfg(3),
            Some(&mut d),
            |_| true,
        )
        .unwrap();
        kept += drafted.accepted;
        for (k, g) in [plain, drafted].iter().enumerate() {
            for pos in 1..3 {
                *counts[k].entry((pos, g.tokens[pos])).or_default() += 1.0 / n as f64;
            }
        }
    }
    assert!(kept > 0, "no draft was ever kept: the test checks nothing");
    let keys: std::collections::HashSet<_> = counts.iter().flat_map(|c| c.keys()).collect();
    for (pos, &guess) in greedy.iter().enumerate().skip(1) {
        let tv: f64 = keys
            .iter()
            .filter(|k| k.0 == pos)
            .map(|k| (counts[0].get(k).unwrap_or(&0.0) - counts[1].get(k).unwrap_or(&0.0)).abs())
            .sum::<f64>()
            / 2.0;
        assert!(tv < 0.045, "position {pos}: total variation {tv:.3}");
        // Drafts accepted blindly would put most of the mass on the draft's token.
        let on_draft = counts[0].get(&(pos, guess)).unwrap_or(&0.0);
        assert!(*on_draft < 0.9, "the test model is too peaked: {on_draft}");
    }
}

/// A sparse model's checked batch computes each token as its one-token step does: the same
/// logits, bit for bit, and the same neurons confirmed.
#[test]
fn a_sparse_models_checked_batch_equals_its_steps() {
    use pi2_engine::{Logits, SparseFfn};
    let m = model();
    let sp = SparseFfn::from_dense(&m, &[0.05, 0.08], None).unwrap();
    let cfg = EngineConfig {
        threads: 1,
        n_ctx: 128,
        ..EngineConfig::default()
    };
    let parts = |sp| pi2_engine::EngineParts {
        sparse: Some(sp),
        ..Default::default()
    };
    let mut steps = Engine::with_parts(&m, &cfg, parts(&sp)).unwrap();
    let one: Vec<Vec<f32>> = PROMPT
        .iter()
        .map(|&t| steps.forward(&[t], Logits::Last).unwrap().to_vec())
        .collect();
    let mut batch = Engine::with_parts(&m, &cfg, parts(&sp)).unwrap();
    let all = batch
        .forward_decode(&PROMPT, Logits::From(0))
        .unwrap()
        .to_vec();
    let nv = m.config.n_vocab;
    for (t, row) in one.iter().enumerate() {
        // Each token of a checked batch goes through the decode step's own pipeline: the
        // same logits, bit for bit, so greedy text never flips at a near tie.
        assert!(
            row == &all[t * nv..(t + 1) * nv],
            "token {t}: the batch differs from its step"
        );
    }
    assert_eq!(
        steps.sparse_stats().confirmed,
        batch.sparse_stats().confirmed,
        "the batch confirmed other neurons than the steps"
    );
}

/// A draft model (its own engine and cache): greedy output equals plain decode's whether the
/// drafts are all right (the same model) or often wrong (another model, same vocabulary).
#[test]
fn draft_models_keep_plain_decodes_tokens() {
    let m = model();
    let other = Model::from_file(
        GgufFile::from_bytes(
            &build(&SynthSpec {
                seed: 99,
                n_embd: 32,
                n_ff: 64,
                n_layer: 1,
                n_head: 2,
                n_head_kv: 1,
                weight_type: QuantType::F32,
                embd_type: QuantType::F32,
                // Its own output matrix: greedy tokens unlike the model's.
                tied: false,
                ..SynthSpec::default()
            })
            .to_bytes(),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(pi2_engine::vocabulary_mismatch(&m, &other), None);
    let plain = generate(
        &mut engine(&m),
        &mut Sampler::new(SamplerConfig::greedy()),
        &mut Vec::new(),
        &PROMPT,
        &cfg(40),
        |_| true,
    )
    .unwrap();
    for (draft_model, all_right) in [(&m, true), (&other, false)] {
        let mut d = ModelDraft::new(engine(draft_model), 16);
        let mut e = engine(&m);
        let g = generate_drafted(
            &mut e,
            &mut Sampler::new(SamplerConfig::greedy()),
            &mut Vec::new(),
            &PROMPT,
            &cfg(40),
            Some(&mut d),
            |_| true,
        )
        .unwrap();
        assert_eq!(g.tokens, plain.tokens);
        assert!(g.drafted > 0 && d.failures == 0);
        if all_right {
            // Its own drafts are the model's greedy tokens: every one is kept.
            assert_eq!(g.accepted, g.drafted);
        } else {
            assert!(
                g.accepted < g.drafted,
                "{} of {}: {:?}",
                g.accepted,
                g.drafted,
                g.tokens
            );
        }
    }
}

#[test]
fn a_draft_model_with_another_vocabulary_is_named() {
    let m = model();
    let (mut tokens, _, _) = pi2_model::synth::vocab();
    tokens[100] = "changed".into();
    let mut w = build(&SynthSpec::default());
    w.set_meta(
        "tokenizer.ggml.tokens",
        pi2_model::Value::Array(tokens.into_iter().map(pi2_model::Value::String).collect()),
    );
    let other = Model::from_file(GgufFile::from_bytes(&w.to_bytes()).unwrap()).unwrap();
    let why = pi2_engine::vocabulary_mismatch(&m, &other).unwrap();
    assert!(
        why.starts_with("token 100 is") && why.contains("same vocabulary"),
        "{why}"
    );
}
