//! Conversion on synthetic models: round trips that run sparse, refusals, and a verifier that
//! catches a changed file.

use pi2_convert::{self as convert, ConvertConfig, ConvertError};
use pi2_engine::{Engine, EngineConfig, EngineParts, Logits};
use pi2_kernels::QuantType;
use pi2_model::synth::{build, SynthSpec};
use pi2_model::{GgufFile, Model};
use pi2_sparse::{Activation, ModelInfo, PredictorKind, Profile};

fn spec() -> SynthSpec {
    SynthSpec {
        n_embd: 64,
        n_ff: 192,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        weight_type: QuantType::Q4_1,
        embd_type: QuantType::F32,
        ..SynthSpec::default()
    }
}

fn cfg() -> EngineConfig {
    EngineConfig {
        threads: 2,
        n_ctx: 256,
        ..EngineConfig::default()
    }
}

const TOKENS: [u32; 12] = [5, 17, 42, 3, 99, 7, 64, 12, 8, 150, 33, 2];

/// Calibration over 200 synthetic tokens, thresholds for 50% sparsity.
fn calibrate(m: &Model) -> (Profile, Vec<f32>, convert::Samples) {
    let c = &m.config;
    let toks: Vec<u32> = (0..200u32)
        .map(|i| (i * 37 + 11) % c.n_vocab as u32)
        .collect();
    let info = ModelInfo {
        architecture: "llama".into(),
        n_layer: c.n_layer,
        n_embd: c.n_embd,
        n_ff: c.n_ff,
        activation: Activation::Silu,
        file_name: "synth".into(),
        file_bytes: 0,
    };
    let mut e = Engine::new(m, &cfg()).unwrap();
    let cal = convert::calibrate(&mut e, &toks, 100, 0.5, info).unwrap();
    (cal.profile, cal.thresholds, cal.samples)
}

fn config(kind: PredictorKind) -> ConvertConfig {
    ConvertConfig {
        sparsity: 0.5,
        predictor: Some(kind),
        granule: 256,
        fit: pi2_sparse::FitConfig {
            max_rank: 64,
            epochs: 3,
            ..Default::default()
        },
        ..ConvertConfig::default()
    }
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-3);
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

#[test]
fn convert_round_trips_and_runs_sparse() {
    let m = Model::from_file(GgufFile::from_bytes(&build(&spec()).to_bytes()).unwrap()).unwrap();
    let (profile, th, samples) = calibrate(&m);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.gguf");
    std::fs::write(&input, build(&spec()).to_bytes()).unwrap();
    for kind in [PredictorKind::Lowrank, PredictorKind::Trained] {
        let (w, report) =
            convert::convert(&m, &profile, &th, samples.clone(), &config(kind)).unwrap();
        assert_eq!(report.layers.len(), 2);
        let out = dir.path().join(format!("out-{}.gguf", kind.name()));
        convert::write_file(&w, &out, &input, false).unwrap();
        // Never over an existing file without force, never over the input.
        assert!(convert::write_file(&w, &out, &input, false).is_err());
        assert!(convert::write_file(&w, &input, &input, true).is_err());
        let conv = Model::load(&out).unwrap();
        convert::verify(&m, &conv).unwrap();
        assert_eq!(conv.file.alignment, 256);
        let (sp, prof) = pi2_engine::load_sparse(&conv).unwrap().unwrap();
        assert!(sp.use_predictor && prof.is_some());
        assert_eq!(sp.layers[0].predictor.as_ref().unwrap().kind, kind);
        // The converted model agrees with its source densely (the permutation does not change
        // the function) and runs sparse.
        let mut e0 = Engine::new(&m, &cfg()).unwrap();
        let want = e0.forward(&TOKENS, Logits::Last).unwrap().to_vec();
        // The whole output matrix, through the clustered head's stored order.
        let whole = EngineConfig {
            head_share: Some(1.0),
            ..cfg()
        };
        let mut e1 = Engine::new(&conv, &whole).unwrap();
        let got = e1.forward(&TOKENS, Logits::Last).unwrap().to_vec();
        assert!(
            max_rel_diff(&want, &got) < 5e-2,
            "{}",
            max_rel_diff(&want, &got)
        );
        let parts = EngineParts {
            sparse: Some(&sp),
            ..Default::default()
        };
        let mut e1 = Engine::with_parts(&conv, &cfg(), parts).unwrap();
        for &t in &TOKENS {
            e1.forward(&[t], Logits::Last).unwrap();
        }
        let st = e1.sparse_stats();
        assert!(
            st.candidate_fraction() < 1.0 && st.confirmed_fraction() <= st.candidate_fraction()
        );
    }
    // A corrupted key is refused by the loader with its name.
    let out = dir.path().join("out-lowrank.gguf");
    let mut bytes = std::fs::read(&out).unwrap();
    let key = b"pi2.sparse.thresholds";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap();
    bytes[at + 4] = b'X';
    let bad = Model::from_file(GgufFile::from_bytes(&bytes).unwrap()).unwrap();
    let err = pi2_engine::load_sparse(&bad).unwrap_err().to_string();
    assert!(err.contains("pi2.sparse.thresholds"), "{err}");
}

/// One changed byte in a neuron row or a dense tensor fails verification, naming the tensor.
#[test]
fn verify_catches_changed_weights() {
    let m = Model::from_file(GgufFile::from_bytes(&build(&spec()).to_bytes()).unwrap()).unwrap();
    let (profile, th, samples) = calibrate(&m);
    let (w, _) =
        convert::convert(&m, &profile, &th, samples, &config(PredictorKind::Lowrank)).unwrap();
    let mut image = Vec::new();
    w.write(&mut image).unwrap();
    let good = Model::from_file(GgufFile::from_bytes(&image).unwrap()).unwrap();
    convert::verify(&m, &good).unwrap();
    for tensor in [
        "blk.1.ffn_up.weight",
        "blk.0.attn_q.weight",
        "blk.0.ffn_perm",
    ] {
        let t = good.file.tensor(tensor).unwrap();
        let at = (good.file.data_offset + t.offset) as usize + 3;
        let mut bytes = image.clone();
        // A perm entry gets an out-of-range high byte; weights get one bit flipped.
        bytes[at] ^= if tensor.ends_with("perm") { 0x40 } else { 0x10 };
        let changed = Model::from_file(GgufFile::from_bytes(&bytes).unwrap()).unwrap();
        let err = convert::verify(&m, &changed).expect_err(tensor);
        assert!(matches!(err, ConvertError::Verify(_)), "{tensor}: {err}");
        let name = tensor.trim_end_matches(".weight");
        assert!(err.to_string().contains(name), "{tensor}: {err}");
    }
}

/// Bad settings and the wrong kind of model are refused before any work.
#[test]
fn bad_requests_are_refused() {
    let m = Model::from_file(GgufFile::from_bytes(&build(&spec()).to_bytes()).unwrap()).unwrap();
    let (profile, th, samples) = calibrate(&m);
    let wrong = vec![th[0]];
    assert!(convert::convert(
        &m,
        &profile,
        &wrong,
        samples.clone(),
        &config(PredictorKind::Lowrank)
    )
    .is_err());
    let granule = ConvertConfig {
        granule: 1000,
        ..config(PredictorKind::Lowrank)
    };
    assert!(convert::convert(&m, &profile, &th, samples, &granule).is_err());
    let moe = SynthSpec {
        n_expert: 4,
        n_expert_used: 2,
        ..spec()
    };
    let mm = Model::from_file(GgufFile::from_bytes(&build(&moe).to_bytes()).unwrap()).unwrap();
    let err = convert::convert(
        &mm,
        &profile,
        &th,
        convert::Samples {
            layers: Vec::new(),
            hidden: Vec::new(),
        },
        &config(PredictorKind::Lowrank),
    )
    .err()
    .expect("a mixture-of-experts model converted as dense")
    .to_string();
    assert!(err.contains("expert"), "{err}");
}

/// Neuron placement: frequency order alone is hot first; co-activation placement keeps each
/// band of that order (the same neurons, so the pinned prefix stays hot) and reorders inside
/// it; either file computes the same function.
#[test]
fn placement_keeps_bands_of_the_hot_first_order() {
    let m = Model::from_file(GgufFile::from_bytes(&build(&spec()).to_bytes()).unwrap()).unwrap();
    let (profile, th, samples) = calibrate(&m);
    let counts: Vec<u32> = {
        let s = &samples.layers[0];
        (0..spec().n_ff)
            .map(|i| (0..s.len()).filter(|&t| s.fired(t, i)).count() as u32)
            .collect()
    };
    let perm_of = |band: usize| {
        let conv_cfg = ConvertConfig {
            placement_band: band,
            ..config(PredictorKind::Lowrank)
        };
        let (w, _) = convert::convert(&m, &profile, &th, samples.clone(), &conv_cfg).unwrap();
        let conv = Model::from_file(GgufFile::from_bytes(&w.to_bytes()).unwrap()).unwrap();
        let t = conv.file.tensor("blk.0.ffn_perm").unwrap();
        let perm: Vec<u32> = conv
            .file
            .tensor_data(t)
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect();
        let mut e = Engine::new(&conv, &cfg()).unwrap();
        (perm, e.forward(&TOKENS, Logits::Last).unwrap().to_vec())
    };
    let (by_freq, want) = perm_of(1);
    let fired: Vec<u32> = by_freq.iter().map(|&i| counts[i as usize]).collect();
    assert!(fired.windows(2).all(|w| w[0] >= w[1]), "{fired:?}");
    let (placed, got) = perm_of(32);
    assert_ne!(placed, by_freq, "nothing moved inside the bands");
    for (a, b) in by_freq.chunks(32).zip(placed.chunks(32)) {
        let (mut a, mut b) = (a.to_vec(), b.to_vec());
        a.sort();
        b.sort();
        assert_eq!(a, b);
    }
    assert!(
        max_rel_diff(&want, &got) < 1e-3,
        "{}",
        max_rel_diff(&want, &got)
    );
}
