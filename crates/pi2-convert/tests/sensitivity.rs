//! Per-layer sparsity by sensitivity on a synthetic model: what it measures is what sparse
//! batches compute, and what it chooses passes its own held-out check.

use pi2_convert::sensitivity::{choose_sparsity, measure_sensitivity, perplexity, QualityTarget};
use pi2_engine::{Engine, EngineConfig, EngineParts, SparseFfn};
use pi2_kernels::QuantType;
use pi2_model::synth::{build, SynthSpec};
use pi2_model::{GgufFile, Model};
use pi2_sparse::{Activation, ModelInfo, Profile, ProfileConfig, Profiler};

fn model() -> Model {
    let spec = SynthSpec {
        n_embd: 64,
        n_ff: 192,
        n_layer: 3,
        n_head: 4,
        n_head_kv: 2,
        weight_type: QuantType::F32,
        embd_type: QuantType::F32,
        ..SynthSpec::default()
    };
    Model::from_file(GgufFile::from_bytes(&build(&spec).to_bytes()).unwrap()).unwrap()
}

fn cfg() -> EngineConfig {
    EngineConfig {
        threads: 2,
        n_ctx: 256,
        ..EngineConfig::default()
    }
}

fn tokens(m: &Model, n: u32, seed: u32) -> Vec<u32> {
    (0..n)
        .map(|i| (i * 37 + seed) % m.config.n_vocab as u32)
        .collect()
}

fn profile(m: &Model, e: &mut Engine<'_>) -> Profile {
    let c = &m.config;
    let mut p = Profiler::new(c.n_layer, c.n_ff, Activation::Silu);
    e.truncate(0);
    e.forward_observed(&tokens(m, 128, 11), pi2_engine::Logits::Last, Some(&mut p))
        .unwrap();
    e.truncate(0);
    let info = ModelInfo {
        architecture: "llama".into(),
        n_layer: c.n_layer,
        n_embd: c.n_embd,
        n_ff: c.n_ff,
        activation: Activation::Silu,
        file_name: "synth".into(),
        file_bytes: 0,
    };
    let cal = pi2_sparse::Calibration {
        file: "synth".into(),
        tokens: 128,
    };
    p.finish(info, cal, &ProfileConfig::default()).unwrap().0
}

#[test]
fn the_dense_measurement_is_what_sparse_batches_compute() {
    let m = model();
    let mut e = Engine::new(&m, &cfg()).unwrap();
    let p = profile(&m, &mut e);
    let th: Vec<f32> = p
        .layers
        .iter()
        .map(|l| l.threshold_for(0.5).unwrap())
        .collect();
    let text = tokens(&m, 96, 5);
    let dense = perplexity(&mut e, &text, 48, None).unwrap();
    let masked = perplexity(&mut e, &text, 48, Some(&th)).unwrap();
    // Sparse batches with F32 transposed down rows: the same sums in another order.
    let mut sp = SparseFfn::from_dense(&m, &th, Some(QuantType::F32)).unwrap();
    sp.batches_too = true;
    let parts = EngineParts {
        sparse: Some(&sp),
        ..Default::default()
    };
    let mut es = Engine::with_parts(&m, &cfg(), parts).unwrap();
    let sparse = perplexity(&mut es, &text, 48, None).unwrap();
    assert!((masked / sparse - 1.0).abs() < 1e-3, "{masked} vs {sparse}");
    assert!(
        (masked / dense - 1.0).abs() > 1e-4,
        "50% sparsity changed nothing"
    );
    // No threshold is the dense model.
    let zero = perplexity(&mut e, &text, 48, Some(&[0.0; 3])).unwrap();
    assert!((zero / dense - 1.0).abs() < 1e-6, "{zero} vs {dense}");
}

#[test]
fn sensitivity_grows_with_sparsity_and_the_choice_passes_its_check() {
    let m = model();
    let mut e = Engine::new(&m, &cfg()).unwrap();
    let p = profile(&m, &mut e);
    let tuning = tokens(&m, 64, 3);
    let s = measure_sensitivity(&mut e, &p, &tuning, 64, &[0.3, 0.8], |_, _| {}).unwrap();
    s.check(3).unwrap();
    for row in &s.kl {
        assert!(row[0] >= 0.0 && row[1] > row[0], "{row:?}");
    }
    let held = tokens(&m, 96, 29);
    let target = QualityTarget {
        max_increase: 0.02,
        chunk: 48,
        ..QualityTarget::default()
    };
    let c = choose_sparsity(&mut e, &p, &tuning, &held, &[1.0; 3], &target, |_, _, _| {}).unwrap();
    assert!(c.sparse_ppl <= c.dense_ppl * 1.02 + 1e-9, "{c:?}");
    assert!(!c.budgets.is_empty() && c.budgets.len() <= 7);
    assert!(c.sparsity.iter().all(|s| (0.0..=0.9).contains(s)));
    // What it reports is what the thresholds give.
    let again = perplexity(&mut e, &held, 48, Some(&c.thresholds)).unwrap();
    assert!((again / c.sparse_ppl - 1.0).abs() < 1e-9);
    // A loose target buys more sparsity than a tight one.
    let loose = QualityTarget {
        max_increase: 0.5,
        ..target.clone()
    };
    let l = choose_sparsity(&mut e, &p, &tuning, &held, &[1.0; 3], &loose, |_, _, _| {}).unwrap();
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    assert!(mean(&l.sparsity) > mean(&c.sparsity), "{l:?} {c:?}");
}
