//! Mixture-of-experts sparse decode and offload: the chosen experts' neurons run as one sparse
//! step (exact for ReLU-family FFNs at threshold 0), conversion lays every expert out hot-first,
//! and offloaded decode and prefill (experts staged one by one) give the in-memory logits bit
//! for bit.

mod common;

use common::max_rel_diff;
use pi2_convert::{moe, ConvertConfig};
use pi2_engine::{Engine, EngineConfig, Logits, Offload, OffloadConfig, SparseFfn};
use pi2_kernels::QuantType;
use pi2_model::synth::{build, SynthSpec};
use pi2_model::{FfnAct, GgufFile, Model};
use std::path::Path;

fn spec(ty: QuantType, act: FfnAct) -> SynthSpec {
    SynthSpec {
        n_embd: 64,
        n_ff: 128,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        n_expert: 4,
        n_expert_used: 2,
        ffn_act: act,
        weight_type: ty,
        embd_type: QuantType::F32,
        ..SynthSpec::default()
    }
}

fn cfg() -> EngineConfig {
    EngineConfig {
        threads: 2,
        n_ctx: 64,
        cluster: 8,
        // The in-memory reference packs what it can (experts too); offloaded tensors keep the
        // file's row layout: the same values bit for bit.
        repack: true,
        ..EngineConfig::default()
    }
}

const PROMPT: [u32; 5] = [5, 17, 42, 3, 11];
const DECODE: [u32; 10] = [99, 7, 64, 12, 8, 150, 33, 2, 77, 1];

/// Prefill of the prompt, then decode: the logits of every step.
fn run(e: &mut Engine<'_>) -> Result<Vec<Vec<f32>>, pi2_engine::EngineError> {
    e.truncate(0);
    let mut out = vec![e.forward(&PROMPT, Logits::Last)?.to_vec()];
    for &t in &DECODE {
        out.push(e.forward(&[t], Logits::Last)?.to_vec());
    }
    Ok(out)
}

/// An engine streaming `m`'s experts from `path` with a cache of one token's experts and one
/// more, keeping its routing in `routing_memory`.
fn streamed_engine<'m>(
    m: &'m Model,
    path: &Path,
    routing_memory: Option<std::path::PathBuf>,
) -> Engine<'m> {
    let (kv, scratch) = (
        pi2_engine::kv_bytes_start(m, &cfg(), PROMPT.len()) as u64,
        pi2_engine::scratch_bytes(m, &cfg(), PROMPT.len()) as u64,
    );
    let need = pi2_engine::expert_budget(m, kv + scratch);
    let budget = need.minimum + need.slot;
    let cfg_x = OffloadConfig {
        budget,
        routing_memory,
        ..Default::default()
    };
    let stream = pi2_engine::ExpertStream::new(m, path, kv, scratch, &cfg_x).unwrap();
    let parts = pi2_engine::EngineParts {
        experts: Some(stream),
        ..Default::default()
    };
    Engine::with_parts(m, &cfg(), parts).unwrap()
}

/// Stacked experts of a plain quantized file are packed in memory (as llama.cpp repacks them),
/// and every logit is the file's row layout's, bit for bit; experts streamed under a budget are
/// never copied (only attention and the head are), and give the same logits.
#[test]
fn packed_experts_equal_the_row_layout_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    for ty in [QuantType::Q4_0, QuantType::Q8_0, QuantType::Q4_K] {
        let mut sp = spec(ty, FfnAct::Silu);
        (sp.n_embd, sp.n_ff) = (256, 256);
        let path = dir.path().join(format!("{ty}.gguf"));
        std::fs::write(&path, build(&sp).to_bytes()).unwrap();
        let m = Model::load(&path).unwrap();
        let mut rows = Engine::new(
            &m,
            &EngineConfig {
                repack: false,
                ..cfg()
            },
        )
        .unwrap();
        let want = run(&mut rows).unwrap();
        let mut packed = Engine::new(&m, &cfg()).unwrap();
        let got = run(&mut packed).unwrap();
        let c = &m.config;
        let expert_bytes =
            3 * c.n_layer * c.n_expert * c.n_ff * c.n_embd * ty.block_bytes() / ty.block_len();
        for (step, (w, g)) in want.iter().zip(&got).enumerate() {
            let same = w.iter().zip(g).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{ty}: step {step} differs between packed and row experts"
            );
        }
        let mut streamed = streamed_engine(&m, &path, None);
        assert_eq!(
            run(&mut streamed).unwrap(),
            want,
            "{ty}: streamed experts differ"
        );
        // In memory every expert matrix is copied beside attention and the head; streamed,
        // only those (the copies are made on the first pass).
        if pi2_kernels::KernelSet::best().x8.fast {
            let experts_copied = packed.packed_bytes() - streamed.packed_bytes();
            assert!(
                experts_copied >= expert_bytes,
                "{ty}: {experts_copied} bytes of experts copied"
            );
        }
    }
}

#[test]
fn sparse_experts_equal_dense_experts_for_relu_family_ffns() {
    for act in [FfnAct::Relu, FfnAct::DRelu] {
        let m = Model::from_file(
            GgufFile::from_bytes(&build(&spec(QuantType::F32, act)).to_bytes()).unwrap(),
        )
        .unwrap();
        let sp = SparseFfn::from_dense(&m, &[0.0, 0.0], Some(QuantType::F32)).unwrap();
        let mut e = Engine::new(&m, &cfg()).unwrap();
        let dense = run(&mut e).unwrap();
        let mut e = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
        let sparse = run(&mut e).unwrap();
        for (step, (d, s)) in dense.iter().zip(&sparse).enumerate() {
            assert!(
                max_rel_diff(d, s) < 1e-4,
                "{act:?} step {step}: {}",
                max_rel_diff(d, s)
            );
        }
        // Decode computed the two chosen experts' firing neurons only.
        let st = e.sparse_stats();
        assert_eq!(st.token_layers, 2 * DECODE.len() as u64);
        assert_eq!(st.candidates, st.token_layers * 2 * 128);
        let confirmed = st.confirmed_fraction();
        assert!((0.2..0.8).contains(&confirmed), "{act:?}: {confirmed}");
    }
}

/// A converted dReLU MoE model written next to its source in `dir`.
fn converted(dir: &Path) -> (Model, Model, std::path::PathBuf) {
    let bytes = build(&spec(QuantType::Q4_1, FfnAct::DRelu)).to_bytes();
    let input = dir.join("moe.gguf");
    std::fs::write(&input, &bytes).unwrap();
    let src = Model::load(&input).unwrap();
    let mut e = Engine::new(&src, &cfg()).unwrap();
    let tokens: Vec<u32> = (0..96).map(|i| (i * 37 + 11) % 250).collect();
    let counts = moe::count_experts(&mut e, &tokens, 32, &[0.0, 0.0], |_| {}).unwrap();
    drop(e);
    assert_eq!(counts.tokens, 96);
    // Every token goes to two experts in each layer.
    for li in 0..2 {
        assert_eq!(
            counts.routed[li * 4..(li + 1) * 4].iter().sum::<u64>(),
            2 * 96
        );
    }
    let out = dir.join("moe-conv.gguf");
    let cc = ConvertConfig {
        sparsity: 0.0,
        predictor: None,
        down_type: Some(QuantType::Q8_0),
        granule: 256,
        ..ConvertConfig::default()
    };
    // Predictors are refused for experts; the dense converter refuses MoE models.
    let with_predictor = ConvertConfig {
        predictor: Some(pi2_sparse::PredictorKind::Lowrank),
        ..cc.clone()
    };
    let err = moe::convert(
        &src,
        &counts,
        &[0.0, 0.0],
        &with_predictor,
        &out,
        &input,
        false,
        |_, _| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("predictors"), "{err}");
    assert!(!out.exists());
    moe::convert(
        &src,
        &counts,
        &[0.0, 0.0],
        &cc,
        &out,
        &input,
        false,
        |_, _| {},
    )
    .unwrap();
    let err = moe::convert(
        &src,
        &counts,
        &[0.0, 0.0],
        &cc,
        &out,
        &input,
        false,
        |_, _| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("--force"), "{err}");
    let conv = Model::load(&out).unwrap();
    moe::verify(&src, &conv).unwrap();
    // Each expert is hot-first by the counts.
    let freq = pi2_engine::unit_frequencies(&conv).unwrap().unwrap();
    assert_eq!(freq.len(), 8);
    for f in &freq {
        assert!(f.windows(2).all(|w| w[0] >= w[1]));
    }
    (src, conv, out)
}

#[test]
fn converted_experts_run_sparse_and_offloaded_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let (src, m, path) = converted(dir.path());
    let (sp, profile) = pi2_engine::load_sparse(&m).unwrap().unwrap();
    assert!(profile.is_none());
    assert_eq!((sp.experts, sp.layers.len()), (4, 8));

    // The converted file decodes as its source does (down rows re-stored as Q8_0).
    let mut e = Engine::new(&src, &cfg()).unwrap();
    let want_src = run(&mut e).unwrap();
    let mut mem = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
    let want = run(&mut mem).unwrap();
    for (a, b) in want_src.iter().zip(&want) {
        assert!(max_rel_diff(a, b) < 0.05, "{}", max_rel_diff(a, b));
    }

    let freq = pi2_engine::unit_frequencies(&m).unwrap();
    let make = |e: &Engine<'_>, budget: u64, hot_share: f64| {
        Offload::new(
            &m,
            &sp,
            &path,
            pi2_engine::kv_bytes_full(e.model(), &cfg(), 8) as u64,
            pi2_engine::scratch_bytes(e.model(), &cfg(), 8) as u64,
            freq.as_deref(),
            &OffloadConfig {
                budget,
                hot_share,
                ..Default::default()
            },
        )
    };
    let probe = Engine::new(&m, &cfg()).unwrap();
    let minimum = pi2_engine::min_budget(
        &m,
        &sp,
        pi2_engine::kv_bytes_full(probe.model(), &cfg(), 8) as u64,
        pi2_engine::scratch_bytes(probe.model(), &cfg(), 8) as u64,
    )
    .unwrap();
    let err = make(&probe, minimum - 1, 0.0).err().unwrap().to_string();
    assert!(err.contains("memory budget too small"), "{err}");
    let file = m.file.file_size();
    for (budget, hot_share) in [(minimum, 0.0), (minimum + file / 16, 0.5), (4 * file, 0.5)] {
        let e = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
        let o = make(&e, budget, hot_share).unwrap();
        assert!(o.budget().total_used() <= budget);
        assert_eq!(o.hot_counts().len(), 8);
        let mut e = common::sparse_engine(&m, &cfg(), &sp, Some(o)).unwrap();
        for pass in 0..2 {
            let got = run(&mut e).unwrap();
            let what = format!("budget {budget} hot {hot_share} pass {pass}");
            common::assert_same_logits(&want, &got, &what);
        }
        let st = e.offload().unwrap().stats().clone();
        assert_eq!(st.token_layers, 2 * 2 * DECODE.len() as u64);
        // Prefill staged only the experts its tokens were routed to, one at a time.
        assert!(st.dense_layer_reads >= 2 * 2 * 2, "{st:?}");
        assert!(st.dense_layer_reads <= 2 * 2 * 4, "{st:?}");
        if hot_share == 0.0 {
            assert!(st.gate_reads > 0, "{st:?}");
        }
    }
}

/// A streamed mixture keeps how often each expert was chosen for the next run: the next stream
/// starts its cache from it, and computes the same logits.
#[test]
fn a_routing_is_kept_between_runs() {
    let dir = tempfile::tempdir().unwrap();
    let mut sp = spec(QuantType::Q4_0, FfnAct::Silu);
    (sp.n_embd, sp.n_ff) = (256, 256);
    let path = dir.path().join("moe.gguf");
    std::fs::write(&path, build(&sp).to_bytes()).unwrap();
    let m = Model::load(&path).unwrap();
    let memory = dir.path().join("routing/moe.bin");
    let mut runs = Vec::new();
    for run_i in 0..2 {
        let mut e = streamed_engine(&m, &path, Some(memory.clone()));
        let x = e.experts().unwrap();
        assert_eq!(x.remembers_routing(), run_i > 0, "run {run_i}");
        runs.push(run(&mut e).unwrap());
        drop(e);
        assert!(memory.exists(), "run {run_i} kept no routing");
    }
    assert_eq!(runs[0], runs[1]);
}
