//! Shared by the integration tests: calibrating a synthetic model for conversion, comparing
//! logits.

use pi2_engine::{Engine, EngineConfig};
use pi2_model::Model;
use pi2_sparse::{Activation, ModelInfo};

/// A model description for profiles of synthetic models.
#[allow(dead_code)] // not every test crate profiles
pub fn synth_info(m: &Model) -> ModelInfo {
    let c = &m.config;
    ModelInfo {
        architecture: "llama".into(),
        n_layer: c.n_layer,
        n_embd: c.n_embd,
        n_ff: c.n_ff,
        activation: Activation::Silu,
        file_name: "synth".into(),
        file_bytes: 0,
    }
}

/// A profile of `m` over 200 synthetic tokens run in chunks of `chunk`, the per-layer thresholds
/// for `sparsity`, and the predictor samples.
#[allow(dead_code)] // not every test crate profiles
pub fn profile_and_samples(
    m: &Model,
    cfg: &EngineConfig,
    sparsity: f32,
    chunk: usize,
) -> (pi2_sparse::Profile, Vec<f32>, pi2_convert::Samples) {
    let toks: Vec<u32> = (0..200u32)
        .map(|i| (i * 37 + 11) % m.config.n_vocab as u32)
        .collect();
    let mut e = Engine::new(m, cfg).unwrap();
    let c = pi2_convert::calibrate(&mut e, &toks, chunk, sparsity, synth_info(m)).unwrap();
    (c.profile, c.thresholds, c.samples)
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

/// An engine computing with the sparse FFN `sp` (and reading through `offload`).
#[allow(dead_code)] // not every test crate offloads
pub fn sparse_engine<'m>(
    m: &'m Model,
    cfg: &EngineConfig,
    sp: &'m pi2_engine::SparseFfn<'m>,
    offload: Option<pi2_engine::Offload>,
) -> Result<Engine<'m>, pi2_engine::EngineError> {
    let parts = pi2_engine::EngineParts {
        sparse: Some(sp),
        head: None,
        offload,
        experts: None,
    };
    Engine::with_parts(m, cfg, parts)
}

/// `spec`'s synthetic model converted (40% sparsity, a low-rank predictor, Q8_0 down rows, a
/// clustered head of 8-row clusters if `head`) and written in `dir`; calibrated with `cfg`.
#[allow(dead_code)] // not every test crate converts
pub fn converted_model(
    dir: &std::path::Path,
    spec: &pi2_model::synth::SynthSpec,
    cfg: &EngineConfig,
    head: bool,
) -> std::path::PathBuf {
    use pi2_convert::{self as convert, ConvertConfig};
    let bytes = pi2_model::synth::build(spec).to_bytes();
    let m = Model::from_file(pi2_model::GgufFile::from_bytes(&bytes).unwrap()).unwrap();
    let (profile, th, samples) = profile_and_samples(&m, cfg, 0.4, 50);
    let cc = ConvertConfig {
        sparsity: 0.4,
        predictor: Some(pi2_sparse::PredictorKind::Lowrank),
        down_type: Some(pi2_kernels::QuantType::Q8_0),
        head: head.then(|| convert::head::HeadConfig {
            cluster: 8,
            share: 0.25,
            ..Default::default()
        }),
        ..ConvertConfig::default()
    };
    let (w, _) = convert::convert(&m, &profile, &th, samples, &cc).unwrap();
    let input = dir.join("in.gguf");
    std::fs::write(&input, &bytes).unwrap();
    let out = dir.join("bundled.gguf");
    convert::write_file(&w, &out, &input, false).unwrap();
    out
}

/// Each unit's neuron firing frequencies from a converted file's profile.
#[allow(dead_code)] // not every test crate offloads
pub fn frequencies(m: &Model) -> Option<Vec<Vec<f32>>> {
    pi2_engine::load_sparse(m)
        .unwrap()
        .and_then(|(_, p)| p)
        .map(|p| p.layers.iter().map(|l| l.frequency.clone()).collect())
}

/// The small synthetic model the offload tests convert and read from flash.
#[allow(dead_code)] // not every test crate offloads
pub fn offload_spec() -> pi2_model::synth::SynthSpec {
    pi2_model::synth::SynthSpec {
        n_embd: 64,
        n_ff: 192,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        weight_type: pi2_kernels::QuantType::Q4_1,
        embd_type: pi2_kernels::QuantType::F32,
        ..pi2_model::synth::SynthSpec::default()
    }
}

/// An engine configuration whose offloaded decode can be compared bit for bit with in-memory
/// sparse decode: offloaded tensors keep the file's row layout, and so does the reference (the
/// interleaved copies' kernels sum in another order); the reference runs the sparse step that
/// offloaded decode runs.
#[allow(dead_code)] // not every test crate offloads
pub fn offload_cfg(n_ctx: usize) -> EngineConfig {
    EngineConfig {
        threads: 2,
        n_ctx,
        cluster: 8,
        repack: false,
        dense_resident: false,
        ..EngineConfig::default()
    }
}
