//! Sessions built from plain options on synthetic model files: dense, sparse, offloaded under a
//! budget, and the clear refusals of options that cannot work.

use pi2_convert::{calibrate, convert, write_file, ConvertConfig};
use pi2_engine::{generate, Engine, GenerateConfig, Logits, Sampler, SamplerConfig};
use pi2_kernels::QuantType;
use pi2_model::synth::{build, SynthSpec};
use pi2_model::Model;
use pi2_runtime::{prepare, EngineOptions, RuntimeError, SessionOptions, SparseOptions};
use pi2_sparse::{Activation, ModelInfo};
use std::path::{Path, PathBuf};

const TOKENS: [u32; 10] = [5, 17, 42, 3, 99, 7, 64, 12, 8, 150];

fn spec() -> SynthSpec {
    SynthSpec {
        n_embd: 64,
        n_ff: 1024,
        n_layer: 8,
        n_head: 4,
        n_head_kv: 2,
        weight_type: QuantType::Q8_0,
        embd_type: QuantType::F32,
        ..SynthSpec::default()
    }
}

fn options() -> SessionOptions {
    SessionOptions {
        engine: EngineOptions {
            threads: Some(2),
            n_ctx: 32,
            // Offloaded engines read the mapping's row layout: compare like with like.
            repack: false,
            ..EngineOptions::default()
        },
        ..SessionOptions::default()
    }
}

/// A synthetic model file, and its conversion (50% sparsity, low-rank predictors).
fn model_files(dir: &Path) -> (PathBuf, PathBuf) {
    model_files_with(dir, false)
}

/// [`model_files`]; `narrow`: the final norm's weights keep 8 coordinates and shrink the rest
/// a thousandfold, so the final hidden states lie near an 8-dimensional space, as a model
/// whose sparse head's bound separates needs (the random model's states fill every direction).
fn model_files_with(dir: &Path, narrow: bool) -> (PathBuf, PathBuf) {
    let src = dir.join("src.gguf");
    let mut bytes = build(&spec()).to_bytes();
    if narrow {
        let f = pi2_model::GgufFile::from_bytes(&bytes).unwrap();
        let t = f.tensor("output_norm.weight").unwrap();
        let at = (f.data_offset + t.offset) as usize;
        for (j, w) in bytes[at..at + t.size as usize]
            .chunks_exact_mut(4)
            .enumerate()
        {
            let v = f32::from_le_bytes(w.try_into().unwrap());
            w.copy_from_slice(&(if j < 8 { v } else { v * 1e-3 }).to_le_bytes());
        }
    }
    std::fs::write(&src, bytes).unwrap();
    let m = Model::load(&src).unwrap();
    let c = &m.config;
    let info = ModelInfo {
        architecture: "llama".into(),
        n_layer: c.n_layer,
        n_embd: c.n_embd,
        n_ff: c.n_ff,
        activation: Activation::Silu,
        file_name: "src.gguf".into(),
        file_bytes: 0,
    };
    let toks: Vec<u32> = (0..200u32)
        .map(|i| (i * 37 + 11) % c.n_vocab as u32)
        .collect();
    let mut e = Engine::new(&m, &options().engine.config().unwrap()).unwrap();
    let cal = calibrate(&mut e, &toks, 25, 0.5, info).unwrap();
    let cfg = ConvertConfig {
        granule: 512,
        head_share: Some(0.5),
        ..ConvertConfig::default()
    };
    let (w, _) = convert(&m, &cal.profile, &cal.thresholds, cal.samples, &cfg).unwrap();
    let out = dir.join("conv.gguf");
    write_file(&w, &out, &src, false).unwrap();
    (src, out)
}

/// Decodes `TOKENS` one at a time; the logits of every step.
fn decode(e: &mut Engine<'_>) -> Vec<Vec<f32>> {
    TOKENS
        .iter()
        .map(|&t| e.forward(&[t], Logits::Last).unwrap().to_vec())
        .collect()
}

#[test]
fn sessions_run_dense_sparse_and_offloaded() {
    let dir = tempfile::tempdir().unwrap();
    let (src, conv) = model_files(dir.path());
    // Dense: the same logits as an engine made by hand.
    let m = Model::load(&src).unwrap();
    let p = prepare(&m, &src, &options()).unwrap();
    assert!(p.sparse.is_none());
    let by_session = decode(&mut p.engine(4).unwrap());
    let mut by_hand = Engine::new(&m, &options().engine.config().unwrap()).unwrap();
    assert_eq!(by_session, decode(&mut by_hand));
    // A converted model decodes sparsely by itself; offloaded under a budget above the minimum
    // (which counts this process's own memory) by less than the file it gives the same logits
    // bit for bit, having read neurons from the file.
    let cm = Model::load(&conv).unwrap();
    let p = prepare(&cm, &conv, &options()).unwrap();
    assert!(p.sparse.is_some());
    let mut e = p.engine(4).unwrap();
    let in_memory = decode(&mut e);
    assert!(e.sparse_stats().candidate_fraction() < 1.0);
    let process = pi2_runtime::offload::process_bytes(&cm);
    let min =
        pi2_runtime::offload::min_budget(&cm, p.sparse.as_ref().unwrap(), &e, 4, process).unwrap();
    let file = cm.file.file_size();
    assert!(
        min > process && min - process < file,
        "the test model is too small to offload: {min} of {file}"
    );
    // The process's memory as measured once: other tests running in this process meanwhile
    // must not move the budget's split.
    let mut fixed_process = options();
    fixed_process.offload.process_bytes = Some(process);
    let offloaded_opts = SessionOptions {
        mem_budget: Some(format!("{}K", (min + (file - (min - process)) / 3) >> 10)),
        ..fixed_process.clone()
    };
    let p = prepare(&cm, &conv, &offloaded_opts).unwrap();
    let mut e = p.engine(4).unwrap();
    assert_eq!(decode(&mut e), in_memory);
    let st = e.offload().unwrap().stats();
    assert!(st.updown_reads + st.gate_reads > 0, "{st:?}");
    // Below the least that starts (the KV cache of a first batch), the error says what to
    // pass.
    let start_min = |e: &Engine<'_>| {
        let sp = p.sparse.as_ref().unwrap();
        let (kv, scratch) = (e.kv_bytes_start(4) as u64, e.scratch_bytes(4) as u64);
        pi2_engine::min_budget(&cm, sp, kv, scratch).unwrap() + process
    };
    let least_start = start_min(&e);
    assert!(least_start < min);
    let short = SessionOptions {
        mem_budget: Some(format!("{}K", (least_start - 1024) >> 10)),
        ..fixed_process.clone()
    };
    let p = prepare(&cm, &conv, &short).unwrap();
    let msg = p.engine(4).err().expect("below the least").to_string();
    assert!(
        msg.starts_with("--mem-budget:")
            && msg.contains("pass --mem-budget")
            && msg.contains("KV cache"),
        "{msg}"
    );
    // The least does not grow with -c: the KV cache past a first batch is charged as it
    // grows, from the neuron memory.
    let mut long = fixed_process;
    long.engine.n_ctx = 512;
    let p512 = prepare(&cm, &conv, &long).unwrap();
    let e512 = p512.engine(4).unwrap();
    let least_start_512 = start_min(&e512);
    let kv_more = (e512.kv_bytes_full(4) - e.kv_bytes_full(4)) as u64;
    assert!(
        least_start_512 - least_start < kv_more / 8,
        "{least_start} -> {least_start_512} ({kv_more} more KV)"
    );
    // --dense turns a converted model's sparsity off.
    let dense = SessionOptions {
        sparse: SparseOptions {
            dense: true,
            ..SparseOptions::default()
        },
        ..options()
    };
    assert!(prepare(&cm, &conv, &dense).unwrap().sparse.is_none());
}

/// A converted model's sparse output head decodes the tokens of the dense head, in memory and
/// offloaded at the least budget (every output row streamed: the head reads only its candidate
/// rows from flash), and `dense_head` turns it off.
#[test]
fn sparse_head_decodes_the_dense_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let (_, conv) = model_files_with(dir.path(), true);
    let cm = Model::load(&conv).unwrap();
    let process = pi2_runtime::offload::process_bytes(&cm);
    let run = |dense_head: bool, least_budget: bool| {
        let mut o = SessionOptions {
            sparse: SparseOptions {
                dense_head,
                ..SparseOptions::default()
            },
            ..options()
        };
        o.offload.process_bytes = Some(process);
        if least_budget {
            let p = prepare(&cm, &conv, &o).unwrap();
            let e = p.engine(4).unwrap();
            let sp = p.sparse.as_ref().unwrap();
            let min = pi2_runtime::offload::min_budget(&cm, sp, &e, 4, process).unwrap();
            o.mem_budget = Some(format!("{}K", min.div_ceil(1024)));
        }
        let p = prepare(&cm, &conv, &o).unwrap();
        assert_eq!(p.head.is_some(), !dense_head);
        let mut e = p.engine(4).unwrap();
        let mut s = Sampler::new(SamplerConfig::greedy());
        let cfg = GenerateConfig {
            max_tokens: Some(20),
            ignore_eos: true,
            ..GenerateConfig::default()
        };
        let g = generate(&mut e, &mut s, &mut vec![], &TOKENS[..4], &cfg, |_| true).unwrap();
        let out_bytes = e.offload().map(|o| o.stats().out_bytes);
        (g.tokens, e.head_stats(), out_bytes)
    };
    let (dense, off, _) = run(true, false);
    let (sparse, on, _) = run(false, false);
    assert_eq!(sparse, dense);
    assert_eq!(off.steps, 0);
    assert!(on.steps >= 19, "{on:?}");
    assert!(
        on.fallbacks < on.steps,
        "the test head never separates: {on:?}"
    );
    let (streamed_dense, _, dense_reads) = run(true, true);
    let (streamed, st, reads) = run(false, true);
    assert_eq!(streamed_dense, dense);
    assert_eq!(streamed, dense);
    // The same steps separate offloaded, and those read only (about) their rows.
    assert_eq!(
        (st.steps, st.rows, st.fallbacks),
        (on.steps, on.rows, on.fallbacks)
    );
    let (dense_reads, reads) = (dense_reads.unwrap(), reads.unwrap());
    assert!(
        st.flash_bytes > 0 && st.flash_bytes <= st.bytes.min(reads),
        "{st:?} {reads}"
    );
    assert!(
        reads < dense_reads / 4,
        "{reads} vs {dense_reads} bytes of output rows"
    );
}

/// Every refusal names the option and says what to do.
#[test]
fn options_that_cannot_work_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let (src, conv) = model_files(dir.path());
    let m = Model::load(&src).unwrap();
    let cm = Model::load(&conv).unwrap();
    let with = |f: &dyn Fn(&mut SessionOptions)| {
        let mut o = options();
        f(&mut o);
        o
    };
    let refused = |m: &Model, path: &Path, o: SessionOptions, option: &str, hint: &str| {
        let err = match prepare(m, path, &o).and_then(|p| p.engine(4).map(|_| ())) {
            Ok(()) => panic!("{option}: accepted"),
            Err(e) => e,
        };
        let text = err.to_string();
        assert!(
            text.contains(option) && text.contains(hint),
            "{option}: `{text}` should name `{hint}`"
        );
        err
    };
    // Offloading an unconverted model: convert it first.
    let e = refused(
        &m,
        &src,
        with(&|o| o.mem_budget = Some("50%".into())),
        "--mem-budget",
        "pi2 convert",
    );
    assert!(matches!(e, RuntimeError::Option { .. }));
    refused(
        &m,
        &src,
        with(&|o| o.mem_budget = Some("lots".into())),
        "--mem-budget",
        "48M",
    );
    // Sparsity of an unconverted model needs thresholds from somewhere.
    refused(
        &m,
        &src,
        with(&|o| o.sparse.sparsity = Some(0.5)),
        "--sparsity",
        "--profile",
    );
    refused(
        &m,
        &src,
        with(&|o| o.sparse.threshold = Some(f32::NAN)),
        "--threshold",
        ">= 0",
    );
    refused(
        &m,
        &src,
        with(&|o| o.engine.threads = Some(0)),
        "--threads",
        "at least 1",
    );
    refused(
        &m,
        &src,
        with(&|o| o.engine.tier = Some("avx9".into())),
        "--kernel-tier",
        "known:",
    );
    // A budget below what the fixed region needs says how much is needed.
    let e = refused(
        &cm,
        &conv,
        with(&|o| o.mem_budget = Some("4K".into())),
        "budget",
        "",
    );
    assert!(
        matches!(
            e,
            RuntimeError::Option {
                option: "--mem-budget",
                ..
            }
        ),
        "{e}"
    );
    // A plan file that does not exist names the file.
    let missing = dir.path().join("no-such.plan.json");
    refused(
        &cm,
        &conv,
        with(&|o| o.plan = Some(missing.display().to_string())),
        "no-such.plan.json",
        "",
    );
}

/// What sampling through the sparse head changes, measured over text: nothing for greedy and
/// top-k (the bound's guarantee), at most the probability of rows far below the top for
/// temperature alone; the head separates on this model, so the check sees candidates.
#[test]
fn head_tv_is_zero_where_the_bound_guarantees_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_, conv) = model_files_with(dir.path(), true);
    let cm = Model::load(&conv).unwrap();
    let p = prepare(&cm, &conv, &options()).unwrap();
    let head = p.head.as_ref().unwrap();
    let act = cm.weights.output.mat(&cm.file).ty.act_kind();
    let tokens: Vec<u32> = (0..64u32).map(|i| (i * 53 + 7) % 200).collect();
    let cfg = pi2_engine::PerplexityConfig {
        n_ctx: 32,
        n_batch: 8,
        max_chunks: None,
        bos: None,
    };
    let measure = |sampler: SamplerConfig| {
        let mut e = p.engine(8).unwrap();
        let mut tv = pi2_engine::HeadTv::new(head, &sampler, act).unwrap();
        pi2_engine::perplexity_with(&mut e, &tokens, &cfg, Some(&mut tv), |_| {}).unwrap();
        tv.stats()
    };
    let greedy = measure(SamplerConfig::greedy());
    // Two chunks of 32, positions 16..30 scored in each.
    assert_eq!(greedy.tokens, 30);
    assert!(greedy.fallbacks < greedy.tokens, "{greedy:?}");
    assert!(
        greedy.rows < greedy.tokens * cm.config.n_vocab as u64,
        "{greedy:?}"
    );
    assert_eq!(greedy.tv_max, 0.0);
    let top_k = measure(SamplerConfig {
        temperature: 1.0,
        top_k: 5,
        ..SamplerConfig::default()
    });
    assert_eq!(top_k.tv_max, 0.0, "{top_k:?}");
    let temperature = measure(SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplerConfig::default()
    });
    assert!(temperature.tv_max < 1e-3, "{temperature:?}");
    // A repetition penalty makes decode use the dense head: nothing to compare.
    let penalty = SamplerConfig {
        repeat_penalty: 1.1,
        ..SamplerConfig::default()
    };
    assert!(pi2_engine::HeadTv::new(head, &penalty, act).is_none());
}

/// Under a budget too small for the buffers of the batches asked for, a session takes the
/// largest halving that fits instead of refusing: nothing but the budget needs choosing.
#[test]
fn batches_shrink_to_fit_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (_, conv) = model_files(dir.path());
    let cm = Model::load(&conv).unwrap();
    let process = pi2_runtime::offload::process_bytes(&cm);
    let mut o = options();
    o.offload.process_bytes = Some(process);
    let p = prepare(&cm, &conv, &o).unwrap();
    let least = |n_batch: usize| {
        let e = p.engine(n_batch).unwrap();
        let sp = p.sparse.as_ref().unwrap();
        let (kv, scratch) = (e.kv_bytes_start(n_batch), e.scratch_bytes(n_batch));
        pi2_engine::min_budget(&cm, sp, kv as u64, scratch as u64).unwrap() + process
    };
    let (small, large) = (least(16), least(256));
    assert!(small < large, "{small} {large}");
    o.mem_budget = Some(format!("{}K", (small + 2048).div_ceil(1024)));
    let p = prepare(&cm, &conv, &o).unwrap();
    assert!(p.engine(256).is_err(), "256-token batches do not fit");
    let (mut e, n_batch) = p.engine_within_budget(256).unwrap();
    assert!((16..256).contains(&n_batch), "{n_batch}");
    e.forward(&TOKENS[..4], Logits::Last).unwrap();
}
