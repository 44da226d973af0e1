//! The dense engine on the real models against llama.cpp (`testdata/golden/`, see its README
//! for why the comparison is robust rather than bit-exact): SmolLM2-135M, Qwen2.5-Coder-0.5B
//! and Gemma 3 270M. Needs `cargo xtask fetch-model`.

use pi2_engine::{Engine, EngineConfig, Logits};
use pi2_model::Model;
use serde_json::Value;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A real model and its llama.cpp reference data.
struct Reference {
    model: &'static str,
    dir: &'static str,
    /// Full logit vectors: `f32` files, or `f16` ones (larger vocabularies).
    logits: &'static str,
    /// Perplexity chunks checked (c = 512).
    ppl_chunks: usize,
}

const SMOLLM2: Reference = Reference {
    model: "models/SmolLM2-135M-Instruct.Q4_1.gguf",
    dir: "testdata/golden",
    logits: "f32",
    ppl_chunks: 4,
};

const QWEN: Reference = Reference {
    model: "models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
    dir: "testdata/golden/qwen2.5-coder-0.5b",
    logits: "f16",
    ppl_chunks: 8,
};

const GEMMA3: Reference = Reference {
    model: "models/gemma-3-270m-q4_k_m.gguf",
    dir: "testdata/golden/gemma3-270m",
    logits: "f16",
    ppl_chunks: 8,
};

const REFERENCES: [Reference; 3] = [SMOLLM2, QWEN, GEMMA3];

impl Reference {
    fn model(&self) -> Model {
        let path = root().join(self.model);
        assert!(
            path.exists(),
            "test model missing at {}: run `cargo xtask fetch-model` first",
            path.display()
        );
        Model::load(&path).expect("load test model")
    }

    fn golden(&self, name: &str) -> Value {
        serde_json::from_str(&std::fs::read_to_string(root().join(self.dir).join(name)).unwrap())
            .unwrap()
    }

    fn full_logits(&self, name: &str) -> Vec<f32> {
        let file = root()
            .join(self.dir)
            .join(format!("logits_{0}/logits_last_{name}.{0}", self.logits));
        let bytes = std::fs::read(&file).unwrap();
        match self.logits {
            "f16" => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            _ => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect(),
        }
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn argmax(v: &[f32]) -> u32 {
    pi2_engine::Sampler::new(pi2_engine::SamplerConfig::greedy()).sample(&mut v.to_vec())
}

fn engine(m: &Model) -> Engine<'_> {
    Engine::new(
        m,
        &EngineConfig {
            threads: 2,
            n_ctx: 2048,
            tier: None,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn last_logits_match_llama_cpp() {
    for r in REFERENCES {
        last_logits(&r);
    }
}

fn last_logits(r: &Reference) {
    let m = r.model();
    let g = r.golden("logits.json");
    for c in g["cases"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let prompt = ids(&c["prompt_ids"]);
        let mut e = engine(&m);
        let got = e.forward(&prompt, Logits::Last).unwrap().to_vec();
        let want = r.full_logits(name);
        assert_eq!(want.len(), got.len());
        let dot: f64 = got
            .iter()
            .zip(&want)
            .map(|(a, b)| *a as f64 * *b as f64)
            .sum();
        let na: f64 = got.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
        let nb: f64 = want.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
        let cosine = dot / (na * nb);
        let top20: Vec<u32> = c["default"]["top20"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[0].as_u64().unwrap() as u32)
            .collect();
        let mut order: Vec<u32> = (0..got.len() as u32).collect();
        order.sort_by(|&a, &b| got[b as usize].total_cmp(&got[a as usize]));
        let overlap = order[..20].iter().filter(|i| top20.contains(i)).count();
        eprintln!(
            "{name}: cosine {cosine:.5}, top-20 overlap {overlap}, top1 {} vs {}",
            order[0], top20[0]
        );
        // Top-1 must equal llama.cpp's unless llama.cpp's own top-2 margin is under 0.5 (the
        // greedy rule): there rounding decides, and the exact f64 reference in the golden data
        // itself disagrees with llama.cpp on `chat_capital` (margin 0.24). Then pi2's top-1 must
        // be one of llama.cpp's top two.
        let top = c["default"]["top20"].as_array().unwrap();
        let margin = top[0][1].as_f64().unwrap() - top[1][1].as_f64().unwrap();
        if margin >= 0.5 {
            assert_eq!(argmax(&got), top20[0], "{name}: top-1");
        } else {
            assert!(
                top20[..2].contains(&argmax(&got)),
                "{name}: top-1 {} not in llama.cpp's top 2 (margin {margin:.2})",
                argmax(&got)
            );
        }
        assert!(cosine >= 0.995, "{name}: cosine {cosine}");
        assert!(overlap >= 18, "{name}: top-20 overlap {overlap}");
    }
}

#[test]
fn greedy_matches_llama_cpp() {
    for r in REFERENCES {
        greedy(&r);
    }
}

fn greedy(r: &Reference) {
    let m = r.model();
    let g = r.golden("greedy.json");
    for c in g["cases"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        // Chat cases that name their messages: pi2's template rendering gives the same text.
        if let Some(msgs) = c.get("messages").and_then(Value::as_array) {
            let msgs: Vec<pi2_model::Message> = msgs
                .iter()
                .map(|mm| {
                    pi2_model::Message::new(
                        mm["role"].as_str().unwrap(),
                        mm["content"].as_str().unwrap(),
                    )
                })
                .collect();
            let text = m.chat_template().unwrap().render(&msgs, true).unwrap();
            assert_eq!(text, c["text"].as_str().unwrap(), "{name}: rendered chat");
        }
        let prompt = ids(&c["prompt_ids"]);
        let generated = ids(&c["generated_ids"]);
        let steps = c["steps"].as_array().unwrap();
        // The prompt ids themselves come from pi2's tokenizer + template.
        let text = c["text"].as_str().unwrap();
        let add_special = c.get("add_special").and_then(Value::as_bool) == Some(true);
        assert_eq!(
            m.tokenizer
                .encode(text, add_special, c["parse_special"].as_bool().unwrap()),
            prompt,
            "{name}: prompt ids"
        );

        // Teacher-forced: one batch over prompt + generated[..-1], logits for every generated step.
        let mut e = engine(&m);
        let mut all = prompt.clone();
        all.extend_from_slice(&generated[..generated.len() - 1]);
        let n_vocab = m.config.n_vocab;
        let logits = e
            .forward(&all, Logits::From(prompt.len() - 1))
            .unwrap()
            .to_vec();
        let mut total_diff = 0.0;
        let mut unstable_seen = false;
        for (i, step) in steps.iter().enumerate() {
            let row = &logits[i * n_vocab..(i + 1) * n_vocab];
            let margin = step["margin"].as_f64().unwrap();
            let chosen = step["id"].as_u64().unwrap() as usize;
            let want_logit = step["logit"].as_f64().unwrap() as f32;
            // 1.5, plus twice what llama.cpp's own other rounding (one batch, no flash
            // attention) moves this logit where the reference records it: pi2 is a third
            // rounding and may sit beyond either. Gemma's tokens far down the distribution move
            // by over 2 inside llama.cpp and inside pi2 (interleaved vs row layout) alike.
            let spread = step
                .get("logit_batch_no_fa")
                .and_then(Value::as_f64)
                .map_or(0.0, |b| (b as f32 - want_logit).abs());
            // One step of a case may move by up to 3.5: a position where the activations'
            // int8 rounding is unstable. On Qwen2.5-Coder's plain_science step 8 pi2's own
            // summation orders gave -0.97 (interleaved copies, before every kernel summed as the
            // reference does), +2.38 (row layout then) and +2.73 (now), every other step within
            // 0.26. A systematic error moves many steps, and the mean below.
            let diff = (row[chosen] - want_logit).abs();
            total_diff += diff;
            let bound = 1.5 + 2.0 * spread;
            if diff > bound && diff <= 3.5 + 2.0 * spread && !unstable_seen {
                unstable_seen = true;
                eprintln!(
                    "{} {name} step {i}: logit {} vs {want_logit}: the case's one unstable step",
                    r.model, row[chosen]
                );
                continue;
            }
            assert!(
                diff <= bound,
                "{} {name} step {i}: logit {} vs {want_logit} (llama.cpp's own spread {spread:.2})",
                r.model,
                row[chosen]
            );
            // The top token where llama.cpp's lead is over 1: Gemma 3's plain_code step 23
            // (lead 0.54) is a near tie that pi2's summation order turns by 0.03.
            if margin > 1.0 {
                let a = argmax(row) as usize;
                assert_eq!(
                    a, chosen,
                    "{name} step {i} (margin {margin:.2}): pi2 logits chosen {} vs argmax {a} {}",
                    row[chosen], row[a]
                );
            }
        }

        // A systematic error moves every logit: on average they agree far closer.
        let mean_diff = total_diff / steps.len() as f32;
        eprintln!("{name}: mean chosen-logit difference {mean_diff:.3}");
        assert!(
            mean_diff <= 0.5,
            "{name}: mean logit difference {mean_diff}"
        );

        // Free-running: equal up to the first step whose margin is below 0.5.
        let mut e = engine(&m);
        let mut next = argmax(e.forward(&prompt, Logits::Last).unwrap());
        for (i, step) in steps.iter().enumerate() {
            if step["margin"].as_f64().unwrap() < 0.5 {
                eprintln!("{name}: free-running equal for {i} steps (step {i} has margin < 0.5)");
                break;
            }
            assert_eq!(next, generated[i], "{name}: free-running step {i}");
            next = argmax(e.forward(&[next], Logits::Last).unwrap());
        }
    }
}

/// llama-perplexity's running value after the first chunks of Genesis (c = 512), within 1%.
/// The full run (SmolLM2: 98 chunks, final 13.5221) is `pi2 perplexity`; CI checks a prefix.
#[test]
fn perplexity_prefix_matches_llama_cpp() {
    for r in REFERENCES {
        perplexity_prefix(&r);
    }
}

fn perplexity_prefix(r: &Reference) {
    let chunks = r.ppl_chunks;
    let m = r.model();
    let g = r.golden("perplexity.json");
    let corpus = &g["corpora"][0];
    let text = std::fs::read_to_string(root().join("testdata/corpus/kjv_genesis.txt")).unwrap();
    let tokens = m.tokenizer.encode(&text, true, false);
    assert_eq!(
        tokens.len() as u64,
        corpus["n_tokens"].as_u64().unwrap(),
        "token count of the corpus"
    );
    let mut e = engine(&m);
    let cfg = pi2_engine::PerplexityConfig {
        n_ctx: 512,
        n_batch: 512,
        max_chunks: Some(chunks),
        // llama-perplexity starts every chunk with BOS when the model adds one.
        bos: m.tokenizer.add_bos.then_some(m.tokenizer.bos).flatten(),
    };
    let steps = pi2_engine::perplexity(&mut e, &tokens, &cfg, |_| {}).unwrap();
    let running = corpus["running_ppl"].as_array().unwrap();
    for s in &steps {
        let want = running[s.chunk - 1].as_f64().unwrap();
        eprintln!("chunk {}: ppl {:.4} (llama.cpp {want:.4})", s.chunk, s.ppl);
    }
    // The running estimate over all tokens scored so far (1020 after 4 chunks); one early chunk
    // of 255 tokens moves by ~0.5% with rounding alone (pi2's summation order against llama.cpp's).
    assert_eq!(steps.len(), chunks);
    let last = steps.last().unwrap();
    let want = running[chunks - 1].as_f64().unwrap();
    assert!(
        (last.ppl - want).abs() <= 0.01 * want,
        "{}: running PPL after {chunks} chunks: {} vs llama.cpp {want}",
        r.model,
        last.ppl
    );
}

/// One prompt, free-running up to llama.cpp's first small margin: cheap enough to run under qemu
/// for the aarch64 kernels (CI runs it for `aarch64-unknown-linux-musl`).
#[test]
fn short_greedy_matches_llama_cpp() {
    let m = SMOLLM2.model();
    let g = SMOLLM2.golden("greedy.json");
    let c = &g["cases"][0];
    let prompt = ids(&c["prompt_ids"]);
    let generated = ids(&c["generated_ids"]);
    let mut e = engine(&m);
    let mut next = argmax(e.forward(&prompt, Logits::Last).unwrap());
    let mut checked = 0;
    for (i, step) in c["steps"].as_array().unwrap().iter().enumerate() {
        if step["margin"].as_f64().unwrap() < 0.5 {
            break;
        }
        assert_eq!(next, generated[i], "step {i} (kernel tier {:?})", e.tier());
        checked += 1;
        next = argmax(e.forward(&[next], Logits::Last).unwrap());
    }
    assert!(checked >= 3, "only {checked} steps checked");
}

/// A quantized file gives the same answer on every kernel tier this CPU runs, bit for bit: a
/// batched prompt (the multi-token tiles), then single-token steps, with and without the
/// row-interleaved copies. The kernels' own tests check the aarch64 tiers against the same
/// scalar reference under qemu, so a phone computes these logits too.
#[test]
fn every_tier_gives_the_same_logits_bit_for_bit() {
    use pi2_kernels::{KernelSet, Tier};
    let tiers: Vec<Tier> = Tier::ALL
        .into_iter()
        .filter(|&t| KernelSet::for_tier(t).is_some())
        .collect();
    eprintln!("tiers compared: {tiers:?}");
    for r in REFERENCES {
        let m = r.model();
        let g = r.golden("logits.json");
        let prompt = ids(&g["cases"][0]["prompt_ids"]);
        let run = |tier: Tier, repack: bool| -> Vec<u32> {
            let cfg = EngineConfig {
                threads: 2,
                n_ctx: 256,
                tier: Some(tier),
                repack,
                ..Default::default()
            };
            let mut e = Engine::new(&m, &cfg).unwrap();
            let mut bits: Vec<u32> = Vec::new();
            let mut logits = e.forward(&prompt, Logits::Last).unwrap().to_vec();
            for _ in 0..3 {
                bits.extend(logits.iter().map(|v| v.to_bits()));
                logits = e
                    .forward(&[argmax(&logits)], Logits::Last)
                    .unwrap()
                    .to_vec();
            }
            bits
        };
        let want = run(Tier::Scalar, false);
        for &tier in &tiers {
            for repack in [false, true] {
                let got = run(tier, repack);
                let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                assert_eq!(
                    differ,
                    0,
                    "{}: {tier:?} (repack {repack}) differs from the scalar reference in {differ} \
                     of {} logits",
                    r.model,
                    want.len()
                );
            }
        }
    }
}

/// A checked draft batch on a real quantized file gives each token its one-token step's logits,
/// bit for bit, with and without the interleaved copies: the kernels give a batch row the row's
/// value, whatever groups of tokens share weight loads.
#[test]
fn a_checked_batch_equals_its_steps_on_real_files() {
    for r in REFERENCES {
        let m = r.model();
        let g = r.golden("logits.json");
        let prompt = ids(&g["cases"][0]["prompt_ids"]);
        let (head, tail) = prompt.split_at(prompt.len() / 2);
        for repack in [true, false] {
            let cfg = EngineConfig {
                threads: 2,
                n_ctx: 256,
                repack,
                ..Default::default()
            };
            let mut steps = Engine::new(&m, &cfg).unwrap();
            steps.forward(head, Logits::Last).unwrap();
            let one: Vec<Vec<f32>> = (tail.iter())
                .map(|&t| steps.forward(&[t], Logits::Last).unwrap().to_vec())
                .collect();
            let mut batch = Engine::new(&m, &cfg).unwrap();
            batch.forward(head, Logits::Last).unwrap();
            let all = batch
                .forward_decode(tail, Logits::From(0))
                .unwrap()
                .to_vec();
            let nv = m.config.n_vocab;
            for (t, row) in one.iter().enumerate() {
                let differ = (row.iter().zip(&all[t * nv..(t + 1) * nv]))
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                assert_eq!(
                    differ, 0,
                    "{} (repack {repack}) token {t}: {differ} logits differ",
                    r.model
                );
            }
        }
    }
}
