//! Sessions built from plain options on synthetic model files: dense, sparse, offloaded under a
//! budget, and the clear refusals of options that cannot work.

use pi2_engine::{Engine, Logits};
use pi2_model::Model;
use pi2_runtime::{prepare, RuntimeError, SessionOptions, SparseOptions};
use std::path::Path;

mod common;
use common::*;

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
    let ecfg = p.engine_config().unwrap();
    let min = pi2_runtime::offload::min_budget(&cm, p.sparse.as_ref().unwrap(), &ecfg, 4, process)
        .unwrap();
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
    let start_min = |cfg: &pi2_engine::EngineConfig| {
        let sp = p.sparse.as_ref().unwrap();
        let kv = pi2_engine::kv_bytes_start(&cm, cfg, 4) as u64;
        let scratch = pi2_engine::scratch_bytes(&cm, cfg, 4) as u64;
        pi2_engine::min_budget(&cm, sp, kv, scratch).unwrap() + process
    };
    let least_start = start_min(&ecfg);
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
    let cfg512 = p512.engine_config().unwrap();
    let least_start_512 = start_min(&cfg512);
    let kv_more = (pi2_engine::kv_bytes_full(&cm, &cfg512, 4)
        - pi2_engine::kv_bytes_full(&cm, &ecfg, 4)) as u64;
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

/// A converted model's clustered head: through the whole matrix (`head_share` 1) it gives the
/// logits of the same model converted without a head, bit for bit (the stored order is undone);
/// the clustered head gives the same logits in memory and offloaded at the least budget (every
/// output row streamed: it reads only its chosen clusters), its top logit is an exact one, and
/// a check counts its agreement with the whole matrix.
#[test]
fn clustered_head_decodes_as_configured_in_memory_and_offloaded() {
    let dir = tempfile::tempdir().unwrap();
    let (_, conv) = model_files(dir.path());
    let (_, plain) = model_files_with(dir.path(), false);
    let cm = Model::load(&conv).unwrap();
    let pm = Model::load(&plain).unwrap();
    let process = pi2_runtime::offload::process_bytes(&cm);
    let run = |m: &Model, path: &Path, share: Option<f32>, least_budget: bool, check: bool| {
        let mut o = options();
        o.engine.head_share = share;
        o.engine.head_check = check;
        o.offload.process_bytes = Some(process);
        if least_budget {
            let p = prepare(m, path, &o).unwrap();
            let (sp, cfg) = (p.sparse.as_ref().unwrap(), p.engine_config().unwrap());
            let min = pi2_runtime::offload::min_budget(m, sp, &cfg, 4, process).unwrap();
            o.mem_budget = Some(format!("{}K", min.div_ceil(1024)));
        }
        let p = prepare(m, path, &o).unwrap();
        let mut e = p.engine(4).unwrap();
        let logits = decode(&mut e);
        let out_bytes = e.offload().map(|o| o.stats().out_bytes);
        (logits, e.head_stats(), out_bytes)
    };
    let (want, none, _) = run(&pm, &plain, None, false, false);
    assert_eq!(none.steps, 0);
    let (whole, _, _) = run(&cm, &conv, Some(1.0), false, false);
    assert_eq!(whole, want, "the whole matrix through the stored order");
    let (clustered, st, _) = run(&cm, &conv, None, false, true);
    assert_eq!(st.steps, TOKENS.len() as u64);
    let vocab = cm.config.n_vocab as u64;
    assert!(st.rows < st.steps * vocab / 2, "{st:?}");
    // The top logit is always exact: the best cluster's best row reaches its mean.
    for (c, w) in clustered.iter().zip(&want) {
        let top = pi2_engine::argmax(c) as usize;
        assert_eq!(c[top], w[top]);
    }
    assert_eq!(st.checked, TOKENS.len() as u64);
    let agree = clustered
        .iter()
        .zip(&want)
        .filter(|(c, w)| pi2_engine::argmax(c) == pi2_engine::argmax(w))
        .count() as u64;
    assert_eq!(st.top1, agree, "{st:?}");
    assert!(st.mass().unwrap() > 0.0 && st.mass().unwrap() <= 1.0 + 1e-9);
    // Offloaded at the least budget: the same logits, and only the chosen clusters read.
    let (streamed, sst, reads) = run(&cm, &conv, None, true, false);
    assert_eq!(streamed, clustered);
    let (_, _, dense_reads) = run(&pm, &plain, None, true, false);
    let (reads, dense_reads) = (reads.unwrap(), dense_reads.unwrap());
    assert_eq!(sst.flash_bytes, reads);
    assert!(
        reads > 0 && reads < dense_reads / 2,
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
        let cfg = p.engine_config().unwrap();
        let sp = p.sparse.as_ref().unwrap();
        let kv = pi2_engine::kv_bytes_start(&cm, &cfg, n_batch);
        let scratch = pi2_engine::scratch_bytes(&cm, &cfg, n_batch);
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

#[test]
fn bench_runs_both_heads_unless_the_dense_head_is_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let (_, conv) = model_files(dir.path());
    let m = Model::load(&conv).unwrap();
    let o = pi2_runtime::bench::BenchOptions {
        n_prompt: vec![0],
        n_gen: vec![2],
        reps: 1,
        ..Default::default()
    };
    let heads = |head_share: Option<f32>| -> Vec<&'static str> {
        let mut s = options();
        s.engine.head_share = head_share;
        let rows = pi2_runtime::bench::bench(&m, &conv, &s, &o, |_| {}).unwrap();
        rows.iter().map(|r| r.head).collect()
    };
    assert_eq!(heads(None), ["dense", "clustered", "dense", "clustered"]);
    // `--dense-head`: the whole output matrix only.
    assert_eq!(heads(Some(1.0)), ["dense", "dense"]);
}

/// `bench` with drafts adds greedy generation rows on the editing workload, without drafts and
/// with them, for every mode (self-drafts only where a budget keeps part of the model
/// resident, and not without a budget at all).
#[test]
fn bench_measures_drafted_generation_beside_plain() {
    use pi2_runtime::bench::{BenchOptions, DraftKind};
    let dir = tempfile::tempdir().unwrap();
    let (_, conv) = model_files(dir.path());
    let m = Model::load(&conv).unwrap();
    let o = BenchOptions {
        n_prompt: vec![0],
        n_gen: vec![4],
        reps: 1,
        draft: Some(DraftKind::Lookup),
        draft_max: 4,
        ..BenchOptions::default()
    };
    let mut s = options();
    s.engine.head_share = Some(1.0);
    let rows = pi2_runtime::bench::bench(&m, &conv, &s, &o, |_| {}).unwrap();
    let tests: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r.test.as_str(), r.ffn.as_str()))
        .collect();
    assert_eq!(
        tests,
        [
            ("tg4", "dense"),
            ("tg4", "sparse"),
            ("gen4", "dense"),
            ("gen4+lookup", "dense"),
            ("gen4", "sparse"),
            ("gen4+lookup", "sparse"),
        ]
    );
    for r in rows.iter().filter(|r| r.test.starts_with("gen")) {
        assert!(
            r.avg_ts > 0.0 && r.stats["draft"]["drafted"].is_u64(),
            "{r:?}"
        );
    }
    let refused = pi2_runtime::bench::bench(
        &m,
        &conv,
        &s,
        &BenchOptions {
            draft: Some(DraftKind::SelfDraft),
            ..o
        },
        |_| {},
    )
    .unwrap_err();
    assert!(refused.to_string().contains("--mem-budget"), "{refused}");
}
