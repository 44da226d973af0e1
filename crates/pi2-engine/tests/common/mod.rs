//! Shared by the integration tests: profiling a model over synthetic tokens and recording the
//! predictor training samples, as `pi2 profile` and `pi2 convert` do.

use pi2_convert as convert;
use pi2_engine::{Engine, EngineConfig, Logits};
use pi2_model::Model;
use pi2_sparse::{Activation, Calibration, ModelInfo, ProfileConfig, Profiler};

/// A profile of `m` over 200 synthetic tokens run in chunks of `chunk`, the per-layer thresholds
/// for `sparsity`, and the predictor samples.
#[allow(dead_code)] // not every test crate profiles
pub fn profile_and_samples(
    m: &Model,
    cfg: &EngineConfig,
    sparsity: f32,
    chunk: usize,
) -> (pi2_sparse::Profile, Vec<f32>, Vec<pi2_sparse::LayerSamples>) {
    let c = &m.config;
    let toks: Vec<u32> = (0..200u32)
        .map(|i| (i * 37 + 11) % c.n_vocab as u32)
        .collect();
    let mut e = Engine::new(m, cfg).unwrap();
    let mut prof = Profiler::new(c.n_layer, c.n_ff, Activation::Silu);
    for part in toks.chunks(chunk) {
        e.truncate(0);
        e.forward_observed(part, Logits::Last, Some(&mut prof))
            .unwrap();
    }
    let info = ModelInfo {
        architecture: "llama".into(),
        n_layer: c.n_layer,
        n_embd: c.n_embd,
        n_ff: c.n_ff,
        activation: Activation::Silu,
        file_name: "synth".into(),
        file_bytes: 0,
    };
    let cal = Calibration {
        file: "synth".into(),
        tokens: toks.len(),
    };
    let (profile, _) = prof.finish(info, cal, &ProfileConfig::default()).unwrap();
    let th: Vec<f32> = profile
        .layers
        .iter()
        .map(|l| l.threshold_for(sparsity).unwrap())
        .collect();
    let samples = convert::collect_samples(&mut e, &toks, chunk, &th, |_| {}).unwrap();
    (profile, th, samples)
}

/// Largest absolute difference between `a` and `b`, relative to `a`'s largest magnitude.
#[allow(dead_code)] // not every test crate compares logits
pub fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-3);
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

/// Every step's logits identical bit for bit (`what` names the run in the failure).
#[allow(dead_code)] // not every test file uses it
pub fn assert_same_logits(want: &[Vec<f32>], got: &[Vec<f32>], what: &str) {
    for (step, (w, g)) in want.iter().zip(got).enumerate() {
        assert!(
            w.iter().zip(g).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what} step {step}: logits differ"
        );
    }
}
