//! The sparse FFN against the dense one, PowerInfer import, bad input (convert round trips are
//! pi2-convert's tests).

mod common;

use common::max_rel_diff;
use pi2_engine::{Engine, EngineConfig, Logits, SparseFfn};
use pi2_kernels::QuantType;
use pi2_model::synth::{build, SynthSpec};
use pi2_model::{FfnAct, GgufFile, Model, Value};
use pi2_sparse::PredictorKind;

fn spec(ty: QuantType) -> SynthSpec {
    SynthSpec {
        n_embd: 64,
        n_ff: 192,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        weight_type: ty,
        embd_type: QuantType::F32,
        ..SynthSpec::default()
    }
}

fn model(s: &SynthSpec) -> Model {
    Model::from_file(GgufFile::from_bytes(&build(s).to_bytes()).unwrap()).unwrap()
}

fn cfg() -> EngineConfig {
    EngineConfig {
        threads: 2,
        n_ctx: 256,
        ..EngineConfig::default()
    }
}

const TOKENS: [u32; 12] = [5, 17, 42, 3, 99, 7, 64, 12, 8, 150, 33, 2];

/// Logits of every position, decoding one token at a time.
fn decode_all(e: &mut Engine<'_>, toks: &[u32]) -> Vec<Vec<f32>> {
    e.truncate(0);
    toks.iter()
        .map(|&t| e.forward(&[t], Logits::Last).unwrap().to_vec())
        .collect()
}

#[test]
fn sparsity_zero_gives_the_dense_logits() {
    for ty in [QuantType::F32, QuantType::Q4_1] {
        let m = model(&spec(ty));
        let sp = SparseFfn::from_dense(&m, &[0.0, 0.0], Some(QuantType::F32)).unwrap();
        let mut e = Engine::new(&m, &cfg()).unwrap();
        let dense = decode_all(&mut e, &TOKENS);
        let mut e = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
        let sparse = decode_all(&mut e, &TOKENS);
        for (d, s) in dense.iter().zip(&sparse) {
            // dense quantizes the down input to 8 bits; sparse accumulates f32 coefficients
            let tol = if ty == QuantType::F32 { 1e-4 } else { 2e-2 };
            assert!(max_rel_diff(d, s) < tol, "{ty}: {}", max_rel_diff(d, s));
        }
        let st = e.sparse_stats();
        assert_eq!(st.confirmed_fraction(), 1.0);
        assert_eq!(st.candidate_fraction(), 1.0);
    }
}

/// The gather/axpy decode path equals the masked dense computation of a batch, and skipping
/// neurons really changes the result.
#[test]
fn gather_path_equals_masked_dense_batch() {
    let m = model(&spec(QuantType::Q8_0));
    let sp = SparseFfn::from_dense(&m, &[0.05, 0.08], None).unwrap();
    let mut sp_batch = SparseFfn::from_dense(&m, &[0.05, 0.08], None).unwrap();
    sp_batch.batches_too = true;
    let mut e = Engine::new(&m, &cfg()).unwrap();
    let dense = decode_all(&mut e, &TOKENS);
    let mut e = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
    let by_token = decode_all(&mut e, &TOKENS);
    let st = e.sparse_stats().clone();
    assert!(
        st.confirmed_fraction() < 0.95 && st.confirmed_fraction() > 0.05,
        "{}",
        st.confirmed_fraction()
    );
    let mut e = common::sparse_engine(&m, &cfg(), &sp_batch, None).unwrap();
    e.truncate(0);
    let batch = e.forward(&TOKENS, Logits::From(0)).unwrap().to_vec();
    let nv = m.config.n_vocab;
    let mut differs = 0.0f32;
    for (t, row) in by_token.iter().enumerate() {
        let b = &batch[t * nv..(t + 1) * nv];
        assert!(
            max_rel_diff(row, b) < 1e-3,
            "token {t}: {}",
            max_rel_diff(row, b)
        );
        differs = differs.max(max_rel_diff(row, &dense[t]));
    }
    assert!(differs > 1e-3, "sparsity changed nothing");
    let bst = e.sparse_stats();
    assert_eq!(
        bst.confirmed, st.confirmed,
        "batch and decode confirm the same neurons"
    );
}

#[test]
fn powerinfer_files_load() {
    let s = spec(QuantType::F32);
    let base = model(&s);
    let c = &base.config;
    let mut w = build(&s);
    w.magic(*b"PWRI");
    w.meta("powerinfer.sparse_threshold", Value::F32(0.5));
    let rank = 32;
    for li in 0..c.n_layer {
        let down = base.weights.layers[li].down.mat(&base.file);
        let t = pi2_engine::transposed(&down);
        w.tensor(
            &format!("blk.{li}.ffn_down_t.weight"),
            &[c.n_embd as u64, c.n_ff as u64],
            0,
            bytemuck::cast_slice(&t).to_vec(),
        );
        let fc1: Vec<f32> = (0..rank * c.n_embd)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 20.0)
            .collect();
        let fc2: Vec<f32> = (0..c.n_ff * rank)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) / 10.0)
            .collect();
        w.tensor(
            &format!("blk.{li}.fc1.weight"),
            &[c.n_embd as u64, rank as u64],
            0,
            bytemuck::cast_slice(&fc1).to_vec(),
        );
        w.tensor(
            &format!("blk.{li}.fc2.weight"),
            &[rank as u64, c.n_ff as u64],
            0,
            bytemuck::cast_slice(&fc2).to_vec(),
        );
    }
    let bytes = w.to_bytes();
    assert_eq!(&bytes[..4], b"PWRI");
    let m = Model::from_file(GgufFile::from_bytes(&bytes).unwrap()).unwrap();
    let (sp, prof) = pi2_engine::load_sparse(&m).unwrap().unwrap();
    assert!(prof.is_none() && sp.use_predictor);
    let p = sp.layers[0].predictor.as_ref().unwrap();
    assert_eq!(
        (p.kind, p.rank(), p.cut),
        (PredictorKind::Trained, rank, 0.0)
    );
    let mut e = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
    let _ = decode_all(&mut e, &TOKENS);
    let st = e.sparse_stats();
    // threshold 0: every candidate is confirmed; the predictor picks a strict subset
    assert_eq!(st.confirmed, st.candidates);
    assert!(st.candidate_fraction() > 0.0 && st.candidate_fraction() < 1.0);
}

#[test]
fn bad_sparse_input_is_refused() {
    let m = model(&spec(QuantType::F32));
    assert!(SparseFfn::from_dense(&m, &[0.1], None).is_err());
    assert!(SparseFfn::from_dense(&m, &[0.1, f32::NAN], None).is_err());
    assert!(SparseFfn::from_dense(&m, &[0.1, 0.1], Some(QuantType::Q4_K)).is_err());
    // sparse weights of another model shape
    let other = model(&SynthSpec {
        n_ff: 128,
        ..spec(QuantType::F32)
    });
    let sp = SparseFfn::from_dense(&other, &[0.1, 0.1], None).unwrap();
    let err = common::sparse_engine(&m, &cfg(), &sp, None)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("transposed down"), "{err}");
    // a plain model has no sparse layout
    assert!(pi2_engine::load_sparse(&m).unwrap().is_none());
}

/// ReLU-family FFNs are exactly sparse: at threshold 0 the two-phase path skips every neuron
/// whose gate is not positive (about half here), yet gives the dense logits.
#[test]
fn relu_family_skips_inactive_neurons_without_loss() {
    for act in [FfnAct::Relu, FfnAct::DRelu] {
        let m = model(&SynthSpec {
            ffn_act: act,
            ..spec(QuantType::F32)
        });
        let sp = SparseFfn::from_dense(&m, &[0.0, 0.0], Some(QuantType::F32)).unwrap();
        let mut e = Engine::new(&m, &cfg()).unwrap();
        let dense = decode_all(&mut e, &TOKENS);
        let mut e = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
        let sparse = decode_all(&mut e, &TOKENS);
        for (d, s) in dense.iter().zip(&sparse) {
            assert!(max_rel_diff(d, s) < 1e-4, "{act:?}: {}", max_rel_diff(d, s));
        }
        let confirmed = e.sparse_stats().confirmed_fraction();
        assert!((0.3..0.7).contains(&confirmed), "{act:?}: {confirmed}");
    }
}

#[test]
fn sparse_weights_must_fit_the_model_they_are_used_with() {
    let moe = model(&SynthSpec {
        n_expert: 4,
        n_expert_used: 2,
        ..spec(QuantType::F32)
    });
    // A plain MoE file has no sparse layout (and runs dense).
    assert!(pi2_engine::load_sparse(&moe).unwrap().is_none());
    let dense = model(&spec(QuantType::F32));
    let dense_sp = SparseFfn::from_dense(&dense, &[0.0, 0.0], None).unwrap();
    let moe_sp = SparseFfn::from_dense(&moe, &[0.0, 0.0], None).unwrap();
    assert_eq!((moe_sp.experts, moe_sp.layers.len()), (4, 8));
    let err = common::sparse_engine(&moe, &cfg(), &dense_sp, None)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("sparse units"), "{err}");
    assert!(common::sparse_engine(&dense, &cfg(), &moe_sp, None).is_err());
}
