//! Each model family pi2 reads against llama.cpp, on small random-weight files: the recipes and
//! llama.cpp's outputs are in `testdata/families/reference.json` (made once by
//! `testdata/families/make.py` with llama.cpp's own `gguf` writer and llama-cpp-python built
//! from source); the files are rebuilt here from the recipes (`pi2_model::recipe`, every
//! tensor's CRC-32 checked), so no weights are committed and llama.cpp is not needed.
//!
//! Per file and kernel tier: perplexity of a random token sequence within 0.5% of llama.cpp's, the logits after
//! a prompt within 0.05, and llama.cpp's greedy tokens (a step where llama.cpp's best two
//! logits are within 0.05 is a tie either engine may break either way: the comparison stops
//! there).

use pi2_engine::{Engine, EngineConfig, EngineError, Logits};
use pi2_kernels::Tier;
use pi2_model::{GgufFile, Model};
use serde_json::{json, Value};
use std::path::PathBuf;

fn references() -> Vec<Value> {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/families/reference.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    v["files"].as_array().unwrap().clone()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn model(r: &Value) -> Model {
    let w = pi2_model::recipe::build(r).unwrap_or_else(|e| panic!("{}: {e}", r["name"]));
    let f = GgufFile::from_bytes(&w.to_bytes()).unwrap();
    Model::from_file(f).unwrap_or_else(|e| panic!("{}: {e}", r["name"]))
}

fn engine(m: &Model, tier: Tier) -> Engine<'_> {
    let cfg = EngineConfig {
        threads: 2,
        n_ctx: 256,
        tier: Some(tier),
        ..Default::default()
    };
    Engine::new(m, &cfg).unwrap()
}

fn perplexity(e: &mut Engine<'_>, text: &[u32]) -> f64 {
    let n_vocab = e.model().config.n_vocab;
    let logits = e.forward(text, Logits::From(0)).unwrap().to_vec();
    let nll: f64 = (0..text.len() - 1)
        .map(|i| {
            let row = &logits[i * n_vocab..(i + 1) * n_vocab];
            let max = row.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
            let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
            -(row[text[i + 1] as usize] as f64 - max - sum.ln())
        })
        .sum();
    (nll / (text.len() - 1) as f64).exp()
}

fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32
}

/// A checked draft's rejected tokens are taken back by truncating the cache: what follows is
/// what a run that never saw them computes (attention caches, sliding rings and LFM2's
/// convolution rows alike), in batches of one or several.
#[test]
fn every_family_takes_back_rejected_tokens() {
    for r in references() {
        let m = model(&r);
        let mut e = engine(&m, Tier::Scalar);
        let text = ids(&r["llama_cpp"]["text"]);
        let (prompt, kept, wrong) = (&text[..12], &text[12..15], &text[40..44]);
        e.truncate(0);
        e.forward(prompt, Logits::Last).unwrap();
        let straight = e.forward(kept, Logits::From(0)).unwrap().to_vec();
        e.truncate(0);
        e.forward(prompt, Logits::Last).unwrap();
        // A checked draft's batch: its last token's state and every one before it are kept.
        e.forward_decode(&[kept[0], wrong[0], wrong[1], wrong[2]], Logits::Last)
            .unwrap();
        assert_eq!(
            e.truncate(prompt.len() + 1),
            prompt.len() + 1,
            "{}",
            r["name"]
        );
        e.forward(&kept[1..2], Logits::Last).unwrap();
        let last = e.forward(&kept[2..], Logits::Last).unwrap().to_vec();
        let n_vocab = m.config.n_vocab;
        assert_eq!(last, straight[2 * n_vocab..], "{}", r["name"]);
    }
}

/// On every kernel tier this CPU runs.
#[test]
fn every_family_computes_what_llama_cpp_computes() {
    let mut report = Vec::new();
    let tiers = Tier::ALL.into_iter().filter(|t| t.is_supported());
    for (tier, r) in tiers.flat_map(|t| references().into_iter().map(move |r| (t, r))) {
        let name = format!("{} on {tier:?}", r["name"].as_str().unwrap());
        let want = &r["llama_cpp"];
        let m = model(&r);

        // Quantized experts (MXFP4, bit for bit the bytes llama.cpp's `gguf` writes): the
        // logits after the prompt came within 0.057 of llama.cpp's (perplexity within 0.01%,
        // every greedy token equal); F32 files within 0.004.
        let quantized = r["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t.get("type").is_some());
        let tolerance = if quantized { 0.1 } else { 0.05 };
        let mut e = engine(&m, tier);
        let ppl = perplexity(&mut e, &ids(&want["text"]));
        let ppl_want = want["ppl"].as_f64().unwrap();
        let rel = (ppl / ppl_want - 1.0).abs();
        assert!(
            rel < 0.005,
            "{name}: perplexity {ppl} vs llama.cpp {ppl_want}"
        );

        let prompt = ids(&want["prompt"]);
        let mut e = engine(&m, tier);
        let last = e.forward(&prompt, Logits::Last).unwrap().to_vec();
        let diff = last
            .iter()
            .zip(want["last_logits"].as_array().unwrap())
            .map(|(a, b)| (a - b.as_f64().unwrap() as f32).abs())
            .fold(0f32, f32::max);
        assert!(
            diff < tolerance,
            "{name}: logits after the prompt differ by {diff}"
        );

        let (greedy, gaps) = (ids(&want["greedy"]), want["gaps"].as_array().unwrap());
        let mut next = argmax(&last);
        let mut same = 0;
        for (i, &t) in greedy.iter().enumerate() {
            if next != t {
                let gap = gaps[i].as_f64().unwrap();
                assert!(
                    gap < 0.05,
                    "{name}: greedy token {i} is {next}, llama.cpp's {t} (its margin {gap})"
                );
                break;
            }
            same += 1;
            next = argmax(e.forward(&[t], Logits::Last).unwrap());
        }
        report.push(format!(
            "{name}: ppl {ppl:.4} ({:+.4}%), last logits within {diff:.5}, {same}/{} greedy tokens",
            100.0 * (ppl / ppl_want - 1.0),
            greedy.len()
        ));
    }
    eprintln!("{}", report.join("\n"));
}

/// Each family's file converted (no sparsity, no predictor, down rows kept in F32) and run
/// offloaded at half its file (or, where that is below what the fixed region needs, the least
/// budget that starts): the logits after the prompt within 0.05 of llama.cpp's and llama.cpp's
/// greedy tokens (its ties excepted), read through the neuron cache and the reader.
#[test]
fn every_family_runs_under_a_budget_as_llama_cpp_does() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = EngineConfig {
        threads: 2,
        n_ctx: 64,
        cluster: 8,
        repack: false,
        ..Default::default()
    };
    let mut report = Vec::new();
    for r in references() {
        let name = r["name"].as_str().unwrap().to_string();
        let want = &r["llama_cpp"];
        // Biased experts (gpt-oss) have no sparse FFN: under a budget their experts stream
        // (the test below).
        if model(&r).weights.layers[0].expert_biases.is_some() {
            continue;
        }
        // A mixture with leading dense layers is refused by the converter: under a budget its
        // experts stream (the test below).
        if model(&r).config.dense_lead > 0 {
            assert!(converted_or_refusal(dir.path(), &r, &cfg).contains("first"));
            continue;
        }
        // So is a mixture with a dense FFN beside its experts (Gemma 4).
        if model(&r).weights.layers[0].expert_norms.is_some() {
            assert!(converted_or_refusal(dir.path(), &r, &cfg).contains("beside its experts"));
            continue;
        }
        // Layers of different FFN sizes (Gemma 4's wider shared-KV layers) are not profiled:
        // refused by name.
        if !model(&r).config.ffn_sizes.is_empty() {
            let m = model(&r);
            let mut e = Engine::new(&m, &cfg).unwrap();
            let mut profiler = pi2_sparse::Profiler::new(
                m.config.n_layer,
                m.config.n_ff,
                pi2_sparse::Activation::Gelu,
            );
            let err = e
                .forward_observed(&[1, 2], Logits::Last, Some(&mut profiler))
                .unwrap_err();
            assert!(err.to_string().contains("different sizes"), "{name}: {err}");
            continue;
        }
        let path = converted(dir.path(), &r, &cfg);
        let m = Model::load(&path).unwrap();
        let (sp, _) = pi2_engine::load_sparse(&m).unwrap().unwrap();
        let kv = pi2_engine::kv_bytes_full(&m, &cfg, 8) as u64;
        let scratch = pi2_engine::scratch_bytes(&m, &cfg, 8) as u64;
        let least = pi2_engine::min_budget(&m, &sp, kv, scratch).unwrap();
        let budget = least.max(m.file.file_size() / 2);
        let freq = pi2_engine::unit_frequencies(&m).unwrap();
        let o = pi2_engine::Offload::new(
            &m,
            &sp,
            &path,
            kv,
            scratch,
            freq.as_deref(),
            &pi2_engine::OffloadConfig {
                budget,
                hot_share: 0.5,
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let parts = pi2_engine::EngineParts {
            sparse: Some(&sp),
            head: None,
            offload: Some(o),
            experts: None,
        };
        let mut e = Engine::with_parts(&m, &cfg, parts).unwrap();
        let prompt = ids(&want["prompt"]);
        let last = e.forward(&prompt, Logits::Last).unwrap().to_vec();
        let diff = last
            .iter()
            .zip(want["last_logits"].as_array().unwrap())
            .map(|(a, b)| (a - b.as_f64().unwrap() as f32).abs())
            .fold(0f32, f32::max);
        assert!(
            diff < 0.05,
            "{name}: logits after the prompt differ by {diff}"
        );
        let (greedy, gaps) = (ids(&want["greedy"]), want["gaps"].as_array().unwrap());
        let mut next = argmax(&last);
        let mut same = 0;
        for (i, &t) in greedy.iter().enumerate() {
            if next != t {
                let gap = gaps[i].as_f64().unwrap();
                assert!(
                    gap < 0.05,
                    "{name}: greedy token {i} is {next}, llama.cpp's {t} (its margin {gap})"
                );
                break;
            }
            same += 1;
            next = argmax(e.forward(&[t], Logits::Last).unwrap());
        }
        let st = e.offload().unwrap().stats().clone();
        assert!(
            st.gate_reads + st.updown_reads > 0 || st.gate_hits > 0,
            "{name}: {st:?}"
        );
        // Per-layer token embeddings are never resident: a row is read for every token.
        if m.weights.per_layer.is_some() {
            let tokens = (prompt.len() + same) as u64;
            assert!(st.embd_rows >= tokens, "{name}: {} rows read", st.embd_rows);
        }
        report.push(format!(
            "{name}: budget {budget} of a {} byte file, logits within {diff:.5}, {same}/{} greedy tokens, rows read {}, lookup rows read {}",
            m.file.file_size(),
            greedy.len(),
            st.gate_reads + st.updown_reads,
            st.embd_rows
        ));
    }
    eprintln!("{}", report.join("\n"));
}

/// The converter's refusal of the recipe's file.
fn converted_or_refusal(dir: &std::path::Path, r: &Value, cfg: &EngineConfig) -> String {
    let input = dir.join("refused.gguf");
    std::fs::write(&input, pi2_model::recipe::build(r).unwrap().to_bytes()).unwrap();
    let m = Model::load(&input).unwrap();
    let toks: Vec<u32> = (0..64u32).map(|i| i % m.config.n_vocab as u32).collect();
    let mut e = Engine::new(&m, cfg).unwrap();
    let counts = pi2_convert::moe::count_experts(&mut e, &toks, 32, &[0.0; 64], |_| {}).unwrap();
    drop(e);
    let cc = pi2_convert::ConvertConfig {
        predictor: None,
        ..Default::default()
    };
    let out = dir.join("refused-converted.gguf");
    let zeros = vec![0.0; m.config.n_layer];
    let err = pi2_convert::moe::convert(&m, &counts, &zeros, &cc, &out, &input, false, |_, _| {});
    err.expect_err("refused").to_string()
}

/// The recipe's file, converted for offloading without sparsity: dense families through the
/// neuron-bundle converter, mixtures expert by expert.
fn converted(dir: &std::path::Path, r: &Value, cfg: &EngineConfig) -> PathBuf {
    use pi2_convert::{moe, ConvertConfig};
    let name = r["name"].as_str().unwrap();
    let input = dir.join(format!("{name}.gguf"));
    std::fs::write(&input, pi2_model::recipe::build(r).unwrap().to_bytes()).unwrap();
    let m = Model::load(&input).unwrap();
    let out = dir.join(format!("{name}-converted.gguf"));
    let cc = ConvertConfig {
        sparsity: 0.0,
        predictor: None,
        down_type: Some(pi2_kernels::QuantType::F32),
        granule: 256,
        // Every output row computed: the clustered head estimates the rows it skips.
        head: None,
        ..ConvertConfig::default()
    };
    let toks: Vec<u32> = (0..96u32)
        .map(|i| (i * 37 + 11) % m.config.n_vocab as u32)
        .collect();
    let zeros = vec![0.0; m.config.n_layer];
    if m.config.n_expert > 0 {
        let mut e = Engine::new(&m, cfg).unwrap();
        let counts = moe::count_experts(&mut e, &toks, 32, &zeros, |_| {}).unwrap();
        drop(e);
        moe::convert(&m, &counts, &zeros, &cc, &out, &input, false, |_, _| {})
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    } else {
        let mut e = Engine::new(&m, cfg).unwrap();
        let c = &m.config;
        let info = pi2_sparse::ModelInfo {
            architecture: c.arch.name().into(),
            n_layer: c.n_layer,
            n_embd: c.n_embd,
            n_ff: c.n_ff,
            activation: pi2_sparse::Activation::Silu,
            file_name: name.into(),
            file_bytes: 0,
        };
        let c = pi2_convert::calibrate(&mut e, &toks, 32, 0.0, info).unwrap();
        drop(e);
        let (w, _) = pi2_convert::convert(&m, &c.profile, &c.thresholds, c.samples, &cc)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        pi2_convert::write_file(&w, &out, &input, false).unwrap();
    }
    out
}

/// Each mixture-of-experts family's plain file with its experts streamed (no conversion) under a
/// budget that holds its other tensors and only a few experts: the same logits bit for bit as
/// in memory after a prompt (whose batch routes to more experts than the cache holds: several
/// waves) and along greedy decoding, with experts read from the file and found in the cache.
#[test]
fn mixtures_stream_their_experts_from_the_plain_file_as_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = EngineConfig {
        threads: 2,
        n_ctx: 64,
        ..Default::default()
    };
    let mut seen = 0;
    for r in references() {
        let name = r["name"].as_str().unwrap().to_string();
        let w = pi2_model::recipe::build(&r).unwrap();
        let path = dir.path().join(format!("{name}.gguf"));
        std::fs::write(&path, w.to_bytes()).unwrap();
        let m = Model::load(&path).unwrap();
        if m.config.n_expert == 0 {
            continue;
        }
        seen += 1;
        let prompt = ids(&r["llama_cpp"]["prompt"]);
        let mut mem = Engine::new(&m, &cfg).unwrap();
        let kv = pi2_engine::kv_bytes_start(&m, &cfg, prompt.len()) as u64;
        let scratch = pi2_engine::scratch_bytes(&m, &cfg, prompt.len()) as u64;
        let need = pi2_engine::expert_budget(&m, kv + scratch);
        // Half the experts, or at least two tokens' worth (so that decode finds some cached).
        let all = (m.config.n_layer * m.config.n_expert) as u64;
        let per_token = (m.config.n_layer * m.config.n_expert_used) as u64;
        let half = (all / 2).max(2 * per_token).min(all);
        let want: Vec<Vec<f32>> = {
            let mut out = vec![mem.forward(&prompt, Logits::Last).unwrap().to_vec()];
            for _ in 0..12 {
                let next = argmax(out.last().unwrap());
                out.push(mem.forward(&[next], Logits::Last).unwrap().to_vec());
            }
            out
        };
        // A cache of one token's experts and one more, then of half of them.
        for slots in [m.config.n_expert_used as u64 + 1, half] {
            let budget = need.minimum + need.slot * (slots - m.config.n_expert_used as u64);
            // Routed before attention: no guesses, so that what is read early is the
            // exact choice's doing.
            let x = pi2_engine::ExpertStream::new(
                &m,
                &path,
                kv,
                scratch,
                &pi2_engine::OffloadConfig {
                    budget,
                    prefetch_experts: !m.config.route_before_attention,
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(x.slots() as u64, slots, "{name}");
            let parts = pi2_engine::EngineParts {
                experts: Some(x),
                ..Default::default()
            };
            let mut streamed = Engine::with_parts(&m, &cfg, parts).unwrap();
            let got = streamed.forward(&prompt, Logits::Last).unwrap().to_vec();
            assert_eq!(
                got, want[0],
                "{name}: logits after the prompt, {slots} slots"
            );
            for w in want.windows(2) {
                let got = streamed.forward(&[argmax(&w[0])], Logits::Last).unwrap();
                assert_eq!(got, &w[1][..], "{name}: decode logits, {slots} slots");
            }
            let st = streamed.experts().unwrap().stats().clone();
            assert!(st.reads > 0, "{name}: {st:?}");
            if m.config.route_before_attention && slots == half {
                // A decoded token's experts are read while its attention runs (where the
                // cache has room beside the previous layer's).
                assert!(st.prefetch_used > 0, "{name}: {st:?}");
            }
            match slots == half {
                // Decode finds experts chosen before.
                // (A cache of every expert leaves nothing to read ahead.)
                true => assert!(
                    st.hits > 0 && (st.prefetched > 0 || slots == all),
                    "{name}: {st:?}"
                ),
                // The prompt's batch chose more experts than the cache holds.
                false => {
                    let mixtures = (0..m.config.n_layer).filter(|&li| m.config.has_experts(li));
                    assert!(st.waves > 13 * mixtures.count() as u64, "{name}: {st:?}")
                }
            }
        }
        // Too small a budget is refused, naming the least.
        let small = pi2_engine::ExpertStream::new(
            &m,
            &path,
            kv,
            scratch,
            &pi2_engine::OffloadConfig {
                budget: need.minimum - 1,
                ..Default::default()
            },
        );
        let err = small.err().unwrap().to_string();
        assert!(err.contains(&need.minimum.to_string()), "{name}: {err}");
    }
    assert!(seen >= 2, "no mixture-of-experts recipes");
}

/// A read of an expert that fails (a short read: the file changed under the reader) is the
/// pass's error, naming the read; the half-read expert is never served, so the next pass reads
/// it again and computes what memory does, bit for bit.
#[test]
fn a_failed_expert_read_is_an_error_and_never_a_different_answer() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = EngineConfig {
        threads: 2,
        n_ctx: 64,
        ..Default::default()
    };
    let r = references()
        .into_iter()
        .find(|r| r["arch"] == "qwen3moe")
        .expect("a qwen3moe recipe");
    let path = dir.path().join("moe.gguf");
    std::fs::write(&path, pi2_model::recipe::build(&r).unwrap().to_bytes()).unwrap();
    let m = Model::load(&path).unwrap();
    let prompt = ids(&r["llama_cpp"]["prompt"]);
    let want = Engine::new(&m, &cfg)
        .unwrap()
        .forward(&prompt, Logits::Last)
        .unwrap()
        .to_vec();
    let kv = pi2_engine::kv_bytes_start(&m, &cfg, prompt.len()) as u64;
    let scratch = pi2_engine::scratch_bytes(&m, &cfg, prompt.len()) as u64;
    let need = pi2_engine::expert_budget(&m, kv + scratch);
    let x = pi2_engine::ExpertStream::new(
        &m,
        &path,
        kv,
        scratch,
        &pi2_engine::OffloadConfig {
            budget: need.minimum + 4 * need.slot,
            faults: Some(pi2_io::FaultPlan {
                short_at: Some(4),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .unwrap();
    let parts = pi2_engine::EngineParts {
        experts: Some(x),
        ..Default::default()
    };
    let mut e = Engine::with_parts(&m, &cfg, parts).unwrap();
    let err = e.forward(&prompt, Logits::Last).unwrap_err().to_string();
    assert!(err.contains("short read"), "{err}");
    e.truncate(0);
    let got = e.forward(&prompt, Logits::Last).unwrap();
    assert_eq!(got, &want[..]);
}

/// Hostile metadata of the new families is refused at load with an error naming the problem,
/// never a panic: each row changes one key of a recipe.
#[test]
fn broken_layouts_of_the_new_families_are_refused_by_name() {
    let cases: [(&str, &str, Value, &str); 11] = [
        (
            "lfm2-0",
            "lfm2.shortconv.l_cache",
            json!(100000),
            "short convolution spans",
        ),
        (
            "lfm2-0",
            "lfm2.attention.head_count_kv",
            json!([0, 2, 0]),
            "3 entries for 4 layers",
        ),
        (
            "lfm2-0",
            "lfm2.attention.head_count_kv",
            json!([0, 2, 0, 4]),
            "one count for the layers of each kind",
        ),
        (
            "qwen3-0",
            "qwen3.attention.head_count_kv",
            json!([0, 2]),
            "layers without attention heads",
        ),
        (
            "qwen35-0",
            "qwen35.ssm.inner_size",
            json!(12345),
            "gated delta net",
        ),
        (
            "qwen35-0",
            "qwen35.full_attention_interval",
            json!(0),
            "not a layer pattern",
        ),
        (
            "lfm2moe-0",
            "lfm2moe.leading_dense_block_count",
            json!(9),
            "leading dense layers",
        ),
        (
            "gemma4-0",
            "gemma4.attention.shared_kv_layers",
            json!(5),
            "fewer than two layers",
        ),
        (
            "gemma4-0",
            "gemma4.attention.shared_kv_layers",
            json!(4),
            "not an attention layer of its kind",
        ),
        (
            "gemma4-0",
            "gemma4.attention.sliding_window_pattern",
            json!([true, false, true, true, false, false]),
            "last of every N layers global",
        ),
        (
            "gemma4-2",
            "gemma4.embedding_length_per_layer_input",
            json!(9),
            "inp_gate.weight` has shape",
        ),
    ];
    let refs = references();
    for (name, key, value, says) in cases {
        let mut r = refs.iter().find(|r| r["name"] == name).unwrap().clone();
        let meta = r["meta"].as_array_mut().unwrap();
        let ty = match &value {
            Value::Array(a) if a.iter().all(Value::is_boolean) => "arr_bool",
            Value::Array(_) => "arr_i32",
            _ => "u32",
        };
        match meta.iter_mut().find(|m| m[0] == key) {
            Some(m) => (m[1], m[2]) = (ty.into(), value),
            None => meta.push(json!([key, ty, value])),
        }
        let w = pi2_model::recipe::build(&r).unwrap();
        let f = GgufFile::from_bytes(&w.to_bytes()).unwrap();
        let Err(err) = Model::from_file(f) else {
            panic!("{name} with {key} was accepted")
        };
        assert!(err.to_string().contains(says), "{name}, {key}: {err}");
    }
}

/// A gating function pi2 does not compute (llama.cpp's `sqrt(softplus)`, 4) is refused by name
/// at load, never run as another.
#[test]
fn an_unknown_gating_function_is_refused_by_name() {
    let mut r = references()
        .into_iter()
        .find(|r| r["arch"] == "smallthinker")
        .unwrap();
    let meta = r["meta"].as_array_mut().unwrap();
    let gating = meta
        .iter_mut()
        .find(|m| m[0] == "smallthinker.expert_gating_func")
        .unwrap();
    gating[2] = 4.into();
    let w = pi2_model::recipe::build(&r).unwrap();
    let f = GgufFile::from_bytes(&w.to_bytes()).unwrap();
    let Err(err) = Model::from_file(f) else {
        panic!("a gating function pi2 does not compute was accepted")
    };
    let err = err.to_string();
    assert!(err.contains("expert_gating_func = 4"), "{err}");
}

/// The residual stream entering each layer, as a dense pass saw it.
#[derive(Default)]
struct Streams(Vec<Vec<f32>>);

impl pi2_sparse::FfnObserver for Streams {
    fn observe(&mut self, _layer: usize, _x: &[f32], _gate: &[f32]) {}

    fn observe_stream(&mut self, layer: usize, x: &[f32]) {
        self.0.resize_with(layer + 1, Vec::new);
        self.0[layer] = x.to_vec();
    }
}

/// A pass resumed at any layer of a model with per-layer token inputs (Gemma 4) takes them
/// from its tokens: the same logits as the whole pass.
#[test]
fn a_resumed_pass_takes_per_layer_inputs_from_its_tokens() {
    let refs = references();
    let r = refs.iter().find(|r| r["name"] == "gemma4-2").unwrap();
    let m = model(r);
    assert!(m.weights.per_layer.is_some());
    let mut e = engine(&m, Tier::Scalar);
    let tokens = ids(&r["llama_cpp"]["prompt"]);
    // Layers past the shared-KV boundary read keys and values no pass has written yet.
    let stream = vec![0.0; tokens.len() * m.config.n_embd];
    let last = m.config.n_layer - 1;
    let err = e.resume_observed(last, &tokens, &stream, Logits::Last, None);
    assert!(matches!(err, Err(EngineError::ResumeShared { .. })));
    let mut seen = Streams::default();
    let want = (e.forward_observed(&tokens, Logits::Last, Some(&mut seen)))
        .unwrap()
        .to_vec();
    for layer in 1..m.config.n_layer {
        e.truncate(0);
        let got = (e.resume_observed(layer, &tokens, &seen.0[layer], Logits::Last, None))
            .unwrap()
            .to_vec();
        assert_eq!(got, want, "resumed at layer {layer}");
    }
    // Other tokens give other per-layer inputs, so other logits.
    e.truncate(0);
    let other: Vec<u32> = tokens.iter().map(|t| t + 1).collect();
    let got = (e.resume_observed(2, &other, &seen.0[2], Logits::Last, None))
        .unwrap()
        .to_vec();
    assert_ne!(got, want);
}

/// Every family's KV cache (attention keys and values, convolution rows, recurrent states)
/// saved after a prompt and loaded into a fresh engine continues exactly as the original; a
/// cache of another model or context is refused by name.
#[test]
fn every_family_saves_and_restores_its_cache() {
    let refs = references();
    for r in &refs {
        let name = r["name"].as_str().unwrap();
        let m = model(r);
        let prompt = ids(&r["llama_cpp"]["prompt"]);
        let mut e = engine(&m, Tier::Scalar);
        e.forward(&prompt, Logits::Last).unwrap();
        let mut saved = Vec::new();
        e.save_cache(&mut saved).unwrap();
        let want = e.forward(&[prompt[0]], Logits::Last).unwrap().to_vec();
        let mut fresh = engine(&m, Tier::Scalar);
        assert_eq!(
            fresh.load_cache(&mut saved.as_slice()).unwrap(),
            prompt.len()
        );
        let got = fresh.forward(&[prompt[0]], Logits::Last).unwrap().to_vec();
        assert_eq!(got, want, "{name}");
        // Truncated: refused, the cache kept.
        let short = &saved[..saved.len() / 2];
        assert!(fresh.load_cache(&mut &short[..]).is_err(), "{name}");
        assert_eq!(fresh.n_past(), prompt.len() + 1, "{name}");
    }
    let (a, b) = (model(&refs[0]), model(&refs[refs.len() - 1]));
    let mut saved = Vec::new();
    let mut e = engine(&a, Tier::Scalar);
    e.forward(&[1, 2, 3], Logits::Last).unwrap();
    e.save_cache(&mut saved).unwrap();
    let err = engine(&b, Tier::Scalar).load_cache(&mut saved.as_slice());
    assert!(err.unwrap_err().to_string().contains("saved KV cache"));
}
