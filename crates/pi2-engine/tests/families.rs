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

use pi2_engine::{Engine, EngineConfig, Logits};
use pi2_kernels::Tier;
use pi2_model::{GgufFile, Model};
use serde_json::Value;
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

/// On every kernel tier this CPU runs.
#[test]
fn every_family_computes_what_llama_cpp_computes() {
    let mut report = Vec::new();
    let tiers = Tier::ALL.into_iter().filter(|t| t.is_supported());
    for (tier, r) in tiers.flat_map(|t| references().into_iter().map(move |r| (t, r))) {
        let name = format!("{} on {tier:?}", r["name"].as_str().unwrap());
        let want = &r["llama_cpp"];
        let m = model(&r);

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
        report.push(format!(
            "{name}: ppl {ppl:.4} ({:+.4}%), last logits within {diff:.5}, {same}/{} greedy tokens",
            100.0 * (ppl / ppl_want - 1.0),
            greedy.len()
        ));
    }
    eprintln!("{}", report.join("\n"));
}
