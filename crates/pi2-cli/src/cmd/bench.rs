//! `pi2 bench`: llama-bench style prompt-processing (ppN) and text-generation (tgN) throughput.
//! Each test runs once to warm up, then `-r` timed repetitions from an empty context.

use super::{engine_config, load_model};
use crate::ModelArgs;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use pi2_engine::{Engine, Logits};
use pi2_model::Model;
use serde::Serialize;
use std::time::Instant;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Format {
    Md,
    Json,
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// With --mem-budget: measure only the offloaded configurations (skip dense and in-memory
    /// sparse, which page the whole file through memory)
    #[arg(long)]
    pub offload_only: bool,
    /// With one --mem-budget: the ablation ladder, one mechanism added per row: naive per-row
    /// reads (the least cache, nothing pinned, one read at a time, no merging, no overlap of
    /// reads and compute) -> + merged reads -> + hot/cold cache at the budget -> + cluster
    /// pipeline -> + I/O queue depth (--io-depth; it takes --io-engine uring to keep several
    /// reads in flight, pread issues them one by one)
    #[arg(long)]
    pub ablation: bool,
    /// Prompt lengths to test (comma separated; 0 skips)
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Generation lengths to test (comma separated; 0 skips)
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Repetitions per test
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Output format
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Md)]
    pub output: Format,
    /// With sparsity on, every test also runs dense, interleaved repetition by repetition, so
    /// the two rows compare within one run
    #[command(flatten)]
    pub sparse: super::sparse_args::SparseArgs,
    /// With --mem-budget, each budget adds a row of the same test read from flash under it
    #[command(flatten)]
    pub offload: super::sparse_args::OffloadArgs,
    /// Run only the plan from `pi2 plan` (or `auto`: plan now for the first --mem-budget, else
    /// the whole model in memory) and report its predicted speed beside the measured one
    #[arg(long)]
    pub plan: Option<String>,
}

/// One table row.
#[derive(Serialize)]
struct Row {
    model: String,
    size_bytes: u64,
    params: u64,
    backend: String,
    threads: usize,
    test: String,
    n_prompt: usize,
    n_gen: usize,
    avg_ts: f64,
    stddev_ts: f64,
    samples_ts: Vec<f64>,
    /// `dense` or `sparse` (the FFN).
    ffn: String,
    /// Sparse runs: measured fractions (candidates, confirmed, FFN bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    sparse: Option<serde_json::Value>,
    /// With --plan: the plan's predicted tokens/s for this test.
    #[serde(skip_serializing_if = "Option::is_none")]
    predicted_ts: Option<f64>,
    /// The same with the flash re-measured just before this test (offloading plans).
    #[serde(skip_serializing_if = "Option::is_none")]
    predicted_now_ts: Option<f64>,
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() - 1) as f64
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Deterministic pseudo-random prompt tokens (llama-bench uses random tokens too).
pub(crate) fn tokens(model: &Model, n: usize) -> Vec<u32> {
    let v = model.config.n_vocab as u64;
    (0..n as u64)
        .map(|i| ((i * 2654435761 + 12345) % v) as u32)
        .collect()
}

fn time_prompt(e: &mut Engine<'_>, toks: &[u32]) -> Result<f64> {
    e.truncate(0);
    let t = Instant::now();
    e.forward(toks, Logits::Last)?;
    Ok(toks.len() as f64 / t.elapsed().as_secs_f64())
}

fn time_gen(e: &mut Engine<'_>, toks: &[u32], n: usize) -> Result<f64> {
    e.truncate(0);
    let t = Instant::now();
    for &tok in toks.iter().cycle().take(n) {
        e.forward(&[tok], Logits::Last)?;
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

pub fn run(a: BenchArgs) -> Result<()> {
    if a.reps == 0 {
        bail!("-r/--repetitions must be at least 1");
    }
    let model = load_model(&a.model)?;
    let path = super::model_path(&a.model)?;
    let mut budgets = a
        .offload
        .mem_budget
        .iter()
        .map(|b| {
            Ok((
                b.clone(),
                super::sparse_args::parse_size(b, model.file.file_size())?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let applied = match &a.plan {
        Some(spec) => {
            if a.model.threads.len() > 1 {
                bail!("--plan sets the threads; drop -t");
            }
            let ap = super::plan::apply(
                spec,
                &model,
                &path,
                &a.model,
                budgets.first().map(|b| b.1),
                a.offload.emulate_flash.as_deref(),
            )?;
            budgets = ap
                .offload
                .as_ref()
                .map(|o| ("plan".to_string(), o.budget))
                .into_iter()
                .collect();
            Some(ap)
        }
        None => None,
    };
    if a.offload_only && !budgets.is_empty() {
        // Before anything touches the tensors: see `GgufFile::advise_random` (rows that run
        // in memory touch every tensor anyway).
        model.file.advise_random();
    }
    let sparse_args = applied
        .as_ref()
        .map_or(a.sparse.clone(), |ap| ap.sparse_args(&a.sparse));
    let sparse = super::sparse_args::build(&sparse_args, &model, &path, false)?;
    if !budgets.is_empty() && sparse.is_none() {
        bail!("--mem-budget reads FFN neurons from flash: it needs a model made by `pi2 convert`");
    }
    // The ablation ladder: one step per "budget" entry, each with its own offload settings
    // and cluster size.
    let mut ladder: Vec<(super::sparse_args::OffloadArgs, bool, Option<usize>)> = Vec::new();
    if a.ablation {
        if budgets.len() != 1 || applied.is_some() {
            bail!("--ablation needs exactly one --mem-budget and no --plan");
        }
        let sp = sparse.as_ref().expect("checked");
        let l0 = &model.weights.layers[0];
        let row = [
            l0.gate.mat(&model.file).row_bytes(),
            l0.up.mat(&model.file).row_bytes(),
            sp.layers[0].down_t.mat().row_bytes(),
        ]
        .into_iter()
        .max()
        .unwrap_or(1);
        let full = a.offload.clone();
        let naive = super::sparse_args::OffloadArgs {
            hot_share: 0.0,
            io_depth: 1,
            max_read: row.to_string(),
            merge_gap: "0".into(),
            ..full.clone()
        };
        let merged = super::sparse_args::OffloadArgs {
            max_read: full.max_read.clone(),
            merge_gap: full.merge_gap.clone(),
            ..naive.clone()
        };
        let cached = super::sparse_args::OffloadArgs {
            hot_share: full.hot_share,
            ..merged.clone()
        };
        // (settings, at the least budget, one cluster of everything)
        ladder = vec![
            (naive, true, Some(1 << 30)),
            (merged, true, Some(1 << 30)),
            (cached.clone(), false, Some(1 << 30)),
            (cached, false, None),
            (full, false, None),
        ];
        let b = budgets[0].clone();
        let names = ["naive", "+merged", "+cache", "+pipeline", "+depth"];
        budgets = names
            .iter()
            .map(|n| (format!("{} {n}", b.0), b.1))
            .collect();
    }
    // Modes: dense, sparse in memory, then sparse under each budget (index into `budgets`).
    let mut modes: Vec<(Option<&pi2_engine::SparseFfn<'_>>, Option<usize>)> = vec![(None, None)];
    if let Some(sp) = &sparse {
        modes.push((Some(sp), None));
        modes.extend((0..budgets.len()).map(|j| (Some(sp), Some(j))));
    }
    if a.offload_only || a.ablation {
        if budgets.is_empty() {
            bail!("--offload-only needs --mem-budget");
        }
        modes.retain(|m| m.1.is_some());
    }
    if applied.is_some() {
        // Only the plan's own configuration.
        modes = vec![modes.pop().expect("one mode at least")];
    }
    // engine_config checks one thread count; bench sweeps the whole list.
    let base = match &applied {
        Some(ap) => ap.cfg.clone(),
        None => engine_config(&ModelArgs {
            threads: a
                .model
                .threads
                .first()
                .map(|&t| t.max(1))
                .into_iter()
                .collect(),
            ..a.model.clone()
        })?,
    };
    let threads = if a.model.threads.is_empty() || applied.is_some() {
        vec![base.threads]
    } else {
        a.model.threads.clone()
    };
    let main_type = {
        let mut counts = std::collections::HashMap::<&str, u64>::new();
        for t in &model.file.tensors {
            *counts.entry(t.type_name()).or_default() += t.size;
        }
        counts
            .into_iter()
            .max_by_key(|&(_, b)| b)
            .map(|(t, _)| t)
            .unwrap_or("?")
    };
    let name = format!(
        "{} {:.0}M {main_type}",
        model.config.arch.name(),
        model.n_params() as f64 / 1e6
    );
    let mut rows = Vec::new();
    for &t in &threads {
        if t == 0 {
            bail!("thread counts must be at least 1");
        }
        let mut cfg = base.clone();
        cfg.threads = t;
        let max_len = a
            .n_prompt
            .iter()
            .chain(&a.n_gen)
            .copied()
            .max()
            .unwrap_or(0);
        cfg.n_ctx = cfg.n_ctx.max(max_len + 1);
        // Generation runs one token per forward pass: only prompts need batch buffers.
        let max_batch = a.n_prompt.iter().copied().max().unwrap_or(0).max(1);
        if let Some(ap) = &applied {
            // The plan's memory was accounted for its context.
            if ap.plan.n_ctx <= max_len {
                bail!(
                    "the plan is for a context of {} tokens; the tests need {} (plan with a larger -c)",
                    ap.plan.n_ctx,
                    max_len + 1
                );
            }
            cfg.n_ctx = ap.plan.n_ctx;
        } else if !budgets.is_empty() {
            // Under a budget the KV cache counts: hold only what the tests use.
            cfg.n_ctx = max_len + 1;
        }
        let mut e = Engine::new(&model, &cfg)?;
        let mut offloads = Vec::new();
        let base_cluster = e.cluster();
        for (j, (_, b)) in budgets.iter().enumerate() {
            e.set_sparse(sparse.as_ref())?;
            let sp = sparse.as_ref().expect("checked");
            let o = match applied
                .as_ref()
                .and_then(|ap| ap.offload.as_ref().map(|o| (ap, o)))
            {
                Some((ap, ocfg)) => {
                    super::sparse_args::offload_with(ocfg, &model, &path, sp, &e, ap.plan.n_batch)?
                }
                None => {
                    let (args, least) = ladder.get(j).map_or((&a.offload, false), |l| (&l.0, l.1));
                    let b = if least {
                        pi2_engine::min_budget(
                            &model,
                            sp,
                            e.kv_bytes_full() as u64,
                            e.scratch_bytes(max_batch) as u64,
                        )?
                    } else {
                        *b
                    };
                    super::sparse_args::build_offload(args, b, &model, &path, sp, &e, max_batch)?
                }
            };
            offloads.push(Some(o));
        }
        let backend = format!("CPU ({})", e.tier().name());
        let tests = a
            .n_prompt
            .iter()
            .filter(|&&n| n > 0)
            .map(|&n| (n, 0))
            .chain(a.n_gen.iter().filter(|&&n| n > 0).map(|&n| (0, n)));
        for (np, ng) in tests {
            let toks = tokens(&model, np.max(ng));
            let run = |e: &mut Engine<'_>| {
                if np > 0 {
                    time_prompt(e, &toks)
                } else {
                    time_gen(e, &toks, ng)
                }
            };
            let now = match &applied {
                Some(ap) => super::plan::repredict_now(&model, &path, &ap.plan)?,
                None => None,
            };
            let mut samples = vec![Vec::new(); modes.len()];
            let mut stats = vec![None; modes.len()];
            for rep in 0..=a.reps {
                for (k, (mode, budget)) in modes.iter().enumerate() {
                    e.set_sparse(*mode)?;
                    if let Some(j) = budget {
                        e.set_cluster(ladder.get(*j).and_then(|l| l.2).unwrap_or(base_cluster));
                        e.set_offload(offloads[*j].take())?;
                        e.offload_mut().expect("set").reset_stats();
                    }
                    e.reset_stats();
                    let t0 = Instant::now();
                    let ts = run(&mut e);
                    let secs = t0.elapsed().as_secs_f64();
                    let o = e.take_offload();
                    let mut stat = mode.map(|_| super::sparse_args::stats_json(e.sparse_stats()));
                    if let (Some(o), Some(serde_json::Value::Object(m))) = (&o, stat.as_mut()) {
                        m.insert(
                            "offload".into(),
                            super::sparse_args::offload_json(o, np.max(ng), secs),
                        );
                    }
                    if let Some(j) = budget {
                        offloads[*j] = o;
                    }
                    let ts = ts?;
                    if rep > 0 {
                        // repetition 0 warms up
                        samples[k].push(ts);
                    }
                    stats[k] = stat;
                }
            }
            e.set_sparse(None)?;
            let test = if np > 0 {
                format!("pp{np}")
            } else {
                format!("tg{ng}")
            };
            for ((samples, stat), mode) in samples.into_iter().zip(stats).zip(&modes) {
                let (avg, sd) = mean_sd(&samples);
                let row = Row {
                    model: name.clone(),
                    size_bytes: model.file.file_size(),
                    params: model.n_params(),
                    backend: backend.clone(),
                    threads: t,
                    test: test.clone(),
                    n_prompt: np,
                    n_gen: ng,
                    avg_ts: avg,
                    stddev_ts: sd,
                    samples_ts: samples,
                    ffn: match mode {
                        (None, _) => "dense".into(),
                        (Some(_), None) => "sparse".into(),
                        (Some(_), Some(j)) => format!("sparse@{}", budgets[*j].0),
                    },
                    sparse: stat,
                    predicted_ts: applied.as_ref().map(|ap| {
                        if np > 0 {
                            ap.plan.predicted.prefill_tps
                        } else {
                            ap.plan.predicted.decode_tps
                        }
                    }),
                    predicted_now_ts: now.map(|(d, p)| if np > 0 { p } else { d }),
                };
                if let Format::Md = a.output {
                    let planned = applied.is_some();
                    if rows.is_empty() {
                        println!(
                            "| model | size | params | backend | threads | ffn | test | t/s |{}",
                            if planned {
                                " predicted t/s | measured / predicted | predicted, flash now | measured / that |"
                            } else {
                                ""
                            }
                        );
                        println!(
                            "| ----- | ---: | -----: | ------- | ------: | --- | ---: | --: |{}",
                            if planned {
                                " ---: | ---: | ---: | ---: |"
                            } else {
                                ""
                            }
                        );
                    }
                    let versus = row.predicted_ts.map_or(String::new(), |p| {
                        let now = row.predicted_now_ts.map_or(" - | - |".into(), |n| {
                            format!(" {n:.2} | {:.2} |", row.avg_ts / n)
                        });
                        format!(" {p:.2} | {:.2} |{now}", row.avg_ts / p)
                    });
                    println!(
                        "| {} | {:.2} MiB | {:.2} M | {} | {} | {} | {} | {:.2} ± {:.2} |{versus}",
                        row.model,
                        row.size_bytes as f64 / (1 << 20) as f64,
                        row.params as f64 / 1e6,
                        row.backend,
                        row.threads,
                        row.ffn,
                        row.test,
                        row.avg_ts,
                        row.stddev_ts
                    );
                }
                rows.push(row);
            }
        }
    }
    if let Format::Json = a.output {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
    Ok(())
}
