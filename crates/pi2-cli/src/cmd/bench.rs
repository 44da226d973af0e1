//! `pi2 bench`: llama-bench style prompt-processing (ppN) and text-generation (tgN) throughput.
//! Each test runs once to warm up, then `-r` timed repetitions from an empty context.

use super::sparse_args::OffloadArgs;
use crate::ModelArgs;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use pi2_engine::{Engine, EngineConfig, Logits, Offload, SparseFfn};
use pi2_model::Model;
use pi2_runtime::plan::{bench_tokens, Applied};
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
    /// `sparse` when decode ran the sparse output head, else `dense`.
    head: &'static str,
    /// The sparse head's rows, bytes and fallbacks per token (when it ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    head_stats: Option<serde_json::Value>,
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

/// One offloaded configuration of the sweep: its row label, budget, settings, whether it runs
/// at the least budget, and its cluster size (the ablation ladder's rungs differ in these).
struct Budget {
    label: String,
    bytes: u64,
    args: OffloadArgs,
    least: bool,
    cluster: Option<usize>,
}

/// How the FFN of a row runs: dense, sparse in memory, or sparse under budget `j`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Dense,
    Sparse,
    Offload(usize),
}

/// Everything the sweep shares.
struct Setup<'m> {
    model: &'m Model,
    path: std::path::PathBuf,
    sparse: Option<SparseFfn<'m>>,
    applied: Option<Applied>,
    budgets: Vec<Budget>,
    /// FFN modes, each with the sparse output head (true) or the dense one.
    modes: Vec<(Mode, bool)>,
    head: Option<pi2_engine::SparseHead<'m>>,
    base: EngineConfig,
    threads: Vec<usize>,
    name: String,
}

pub fn run(a: BenchArgs) -> Result<()> {
    if a.reps == 0 {
        bail!("-r/--repetitions must be at least 1");
    }
    let path = super::model_path(&a.model)?;
    let model = pi2_runtime::load_model(&path)?;
    let setup = setup(&a, &model, path)?;
    let mut rows = Vec::new();
    for &t in &setup.threads {
        bench_threads(&a, &setup, t, &mut rows)?;
    }
    if let Format::Json = a.output {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
    Ok(())
}

/// Budgets (or the plan's), the sparse weights, the rows to measure, the base engine
/// configuration and the thread counts.
fn setup<'m>(a: &BenchArgs, model: &'m Model, path: std::path::PathBuf) -> Result<Setup<'m>> {
    let file = model.file.file_size();
    let mut budgets = a
        .offload
        .mem_budget
        .iter()
        .map(|b| {
            Ok(Budget {
                label: b.clone(),
                bytes: pi2_runtime::options::parse_size("--mem-budget", b, file)?,
                args: a.offload.clone(),
                least: false,
                cluster: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if a.plan.is_some() && a.model.threads.len() > 1 {
        bail!("--plan sets the threads; drop -t");
    }
    // The session's pieces (plan, sparse weights, head) come from the runtime, as for `run`;
    // the bench then makes an engine per thread count and budget itself.
    let opts = pi2_runtime::SessionOptions {
        engine: pi2_runtime::EngineOptions {
            threads: None,
            ..a.model.engine_options_first()?
        },
        sparse: a.sparse.options(),
        mem_budget: a.offload.mem_budget.first().cloned(),
        offload: a.offload.options(),
        plan: a.plan.clone(),
        sparse_batches: false,
    };
    let pi2_runtime::Prepared {
        sparse,
        head,
        applied,
        ..
    } = pi2_runtime::prepare(model, &path, &opts)?;
    if let Some(ap) = &applied {
        budgets = ap
            .offload
            .as_ref()
            .map(|o| Budget {
                label: "plan".into(),
                bytes: o.budget,
                args: a.offload.clone(),
                least: false,
                cluster: None,
            })
            .into_iter()
            .collect();
    }
    if a.ablation {
        if budgets.len() != 1 || applied.is_some() {
            bail!("--ablation needs exactly one --mem-budget and no --plan");
        }
        budgets = ladder(model, sparse.as_ref().expect("checked"), &budgets[0]);
    }
    // With a sparse head, in-memory modes run with each head (the dense one first), in the
    // same interleaved repetitions; offloaded modes with the sparse head.
    let modes = modes(a, sparse.is_some(), budgets.len(), applied.is_some())?
        .into_iter()
        .flat_map(|m| {
            let both = head.is_some() && !matches!(m, Mode::Offload(_));
            let heads: &[bool] = match (head.is_some(), both) {
                (false, _) => &[false],
                (true, true) => &[false, true],
                (true, false) => &[true],
            };
            heads.iter().map(move |&h| (m, h))
        })
        .collect();
    let base = match &applied {
        Some(ap) => ap.cfg.clone(),
        None => a.model.engine_options_first()?.config()?,
    };
    let threads = if a.model.threads.is_empty() || applied.is_some() {
        vec![base.threads]
    } else {
        a.model.threads.clone()
    };
    Ok(Setup {
        name: model_name(model),
        model,
        path,
        sparse,
        applied,
        budgets,
        modes,
        head,
        base,
        threads,
    })
}

/// The ablation ladder: one mechanism added per rung, from naive per-row reads at the least
/// budget to everything at the given one.
fn ladder(model: &Model, sp: &SparseFfn<'_>, b: &Budget) -> Vec<Budget> {
    let l0 = &model.weights.layers[0];
    let row = [
        l0.gate.mat(&model.file).row_bytes(),
        l0.up.mat(&model.file).row_bytes(),
        sp.layers[0].down_t.mat().row_bytes(),
    ]
    .into_iter()
    .max()
    .unwrap_or(1);
    let full = b.args.clone();
    let naive = OffloadArgs {
        hot_share: 0.0,
        io_depth: 1,
        max_read: row.to_string(),
        merge_gap: "0".into(),
        ..full.clone()
    };
    let merged = OffloadArgs {
        max_read: full.max_read.clone(),
        merge_gap: full.merge_gap.clone(),
        ..naive.clone()
    };
    let cached = OffloadArgs {
        hot_share: full.hot_share,
        ..merged.clone()
    };
    // (name, settings, at the least budget, one cluster of everything)
    let one = Some(1 << 30);
    [
        ("naive", naive, true, one),
        ("+merged", merged, true, one),
        ("+cache", cached.clone(), false, one),
        ("+pipeline", cached, false, None),
        ("+depth", full, false, None),
    ]
    .into_iter()
    .map(|(n, args, least, cluster)| Budget {
        label: format!("{} {n}", b.label),
        bytes: b.bytes,
        args,
        least,
        cluster,
    })
    .collect()
}

/// The rows of every test: dense, sparse in memory, then sparse under each budget.
fn modes(a: &BenchArgs, sparse: bool, n_budgets: usize, planned: bool) -> Result<Vec<Mode>> {
    let mut modes = vec![Mode::Dense];
    if sparse {
        modes.push(Mode::Sparse);
        modes.extend((0..n_budgets).map(Mode::Offload));
    }
    if a.offload_only || a.ablation {
        if n_budgets == 0 {
            bail!("--offload-only needs --mem-budget");
        }
        modes.retain(|m| matches!(m, Mode::Offload(_)));
    }
    if planned {
        // Only the plan's own configuration.
        modes = vec![modes.pop().expect("one mode at least")];
    }
    Ok(modes)
}

/// "qwen2 630M Q5_0": architecture, parameters and the type holding the most bytes.
fn model_name(model: &Model) -> String {
    let mut counts = std::collections::HashMap::<&str, u64>::new();
    for t in &model.file.tensors {
        *counts.entry(t.type_name()).or_default() += t.size;
    }
    let main_type = counts
        .into_iter()
        .max_by_key(|&(_, b)| b)
        .map(|(t, _)| t)
        .unwrap_or("?");
    format!(
        "{} {:.0}M {main_type}",
        model.config.arch.name(),
        model.n_params() as f64 / 1e6
    )
}

/// The engine configuration for `t` threads, with a context that holds the longest test.
fn thread_config(a: &BenchArgs, s: &Setup<'_>, t: usize) -> Result<EngineConfig> {
    if t == 0 {
        bail!("thread counts must be at least 1");
    }
    let mut cfg = s.base.clone();
    cfg.threads = t;
    let max_len = a
        .n_prompt
        .iter()
        .chain(&a.n_gen)
        .copied()
        .max()
        .unwrap_or(0);
    cfg.n_ctx = cfg.n_ctx.max(max_len + 1);
    if let Some(ap) = &s.applied {
        // The plan's memory was accounted for its context.
        if ap.plan.n_ctx <= max_len {
            bail!(
                "the plan is for a context of {} tokens; the tests need {} (plan with a larger -c)",
                ap.plan.n_ctx,
                max_len + 1
            );
        }
        cfg.n_ctx = ap.plan.n_ctx;
    } else if !s.budgets.is_empty() {
        // Under a budget the KV cache counts: hold only what the tests use.
        cfg.n_ctx = max_len + 1;
    }
    Ok(cfg)
}

/// One offloaded FFN per budget for engine `e` (batches of `max_batch`).
fn offloads<'s>(
    s: &'s Setup<'_>,
    e: &mut Engine<'s>,
    max_batch: usize,
    process: u64,
) -> Result<Vec<Option<Offload>>> {
    let file = s.model.file.file_size();
    let mut out = Vec::new();
    for b in &s.budgets {
        e.set_sparse(s.sparse.as_ref())?;
        let sp = s.sparse.as_ref().expect("checked");
        let (cfg, n_batch) = match s
            .applied
            .as_ref()
            .and_then(|ap| ap.offload.as_ref().map(|o| (ap, o)))
        {
            Some((ap, ocfg)) => (ocfg.clone(), ap.plan.n_batch),
            None => {
                let bytes = match b.least {
                    true => pi2_runtime::offload::min_budget(s.model, sp, e, max_batch, process)?,
                    false => b.bytes,
                };
                (b.args.options().config(bytes, file)?, max_batch)
            }
        };
        let cfg = pi2_engine::OffloadConfig { process, ..cfg };
        out.push(Some(pi2_runtime::offload::build(
            &cfg, s.model, &s.path, sp, e, n_batch,
        )?));
    }
    Ok(out)
}

/// Every test at `t` threads, appending rows (and printing them for `-o md`).
fn bench_threads(a: &BenchArgs, s: &Setup<'_>, t: usize, rows: &mut Vec<Row>) -> Result<()> {
    let cfg = thread_config(a, s, t)?;
    // Generation runs one token per forward pass: only prompts need batch buffers.
    let max_batch = a.n_prompt.iter().copied().max().unwrap_or(0).max(1);
    let mut e = Engine::new(s.model, &cfg)?;
    // Measured before the first offload: later ones (and the plan's prediction redone below)
    // must not count the earlier ones' regions.
    let process = pi2_runtime::offload::process_bytes(s.model);
    let mut offloads = offloads(s, &mut e, max_batch, process)?;
    let tests = a
        .n_prompt
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| (n, 0))
        .chain(a.n_gen.iter().filter(|&&n| n > 0).map(|&n| (0, n)));
    for (np, ng) in tests {
        let now = match &s.applied {
            Some(ap) => pi2_runtime::hardware::repredict_now(s.model, &s.path, &ap.plan, process)?,
            None => None,
        };
        let (samples, stats) = measure_test(a, s, &mut e, &mut offloads, np, ng)?;
        for ((samples, stat), mode) in samples.into_iter().zip(stats).zip(&s.modes) {
            let row = row(s, &e, t, np, ng, samples, stat, *mode, now);
            if let Format::Md = a.output {
                print_row(&row, rows.is_empty(), s.applied.is_some());
            }
            rows.push(row);
        }
    }
    Ok(())
}

/// What one mode's offload reported over a test (JSON), if it offloads.
type IoReport = Option<serde_json::Value>;

/// Samples and statistics of every mode for one test, modes interleaved repetition by
/// repetition (repetition 0 warms up).
fn measure_test<'s>(
    a: &BenchArgs,
    s: &'s Setup<'_>,
    e: &mut Engine<'s>,
    offloads: &mut [Option<Offload>],
    np: usize,
    ng: usize,
) -> Result<(Vec<Vec<f64>>, Vec<IoReport>)> {
    let toks = bench_tokens(s.model, np.max(ng));
    let base_cluster = s.base.cluster.max(4).div_ceil(4) * 4;
    let mut samples = vec![Vec::new(); s.modes.len()];
    let mut stats = vec![None; s.modes.len()];
    e.set_head_need(Some(pi2_engine::HeadNeed::greedy()));
    for rep in 0..=a.reps {
        for (k, &(mode, head)) in s.modes.iter().enumerate() {
            e.set_head(if head { s.head.as_ref() } else { None })?;
            e.set_sparse(match mode {
                Mode::Dense => None,
                _ => s.sparse.as_ref(),
            })?;
            if let Mode::Offload(j) = mode {
                e.set_cluster(s.budgets[j].cluster.unwrap_or(base_cluster));
                e.set_offload(offloads[j].take())?;
                e.offload_mut().expect("set").reset_stats();
            }
            e.reset_stats();
            let t0 = Instant::now();
            let ts = match np > 0 {
                true => time_prompt(e, &toks),
                false => time_gen(e, &toks, ng),
            };
            let secs = t0.elapsed().as_secs_f64();
            let o = e.take_offload();
            let mut stat = match mode {
                Mode::Dense => None,
                _ => Some(super::sparse_args::stats_json(e.sparse_stats())),
            };
            if let (Some(o), Some(serde_json::Value::Object(m))) = (&o, stat.as_mut()) {
                m.insert(
                    "offload".into(),
                    super::sparse_args::offload_json(o, np.max(ng), secs),
                );
            }
            if let Mode::Offload(j) = mode {
                offloads[j] = o;
            }
            if let (true, Some(serde_json::Value::Object(m))) = (head, stat.as_mut()) {
                m.insert("head".into(), head_stats(e));
            } else if head {
                stat = Some(serde_json::json!({ "head": head_stats(e) }));
            }
            let ts = ts?;
            if rep > 0 {
                samples[k].push(ts);
            }
            stats[k] = stat;
        }
    }
    e.set_sparse(None)?;
    e.set_head(None)?;
    Ok((samples, stats))
}

fn head_stats(e: &Engine<'_>) -> serde_json::Value {
    super::sparse_args::head_json(&e.head_stats(), e.model().config.n_vocab)
}

#[allow(clippy::too_many_arguments)]
fn row(
    s: &Setup<'_>,
    e: &Engine<'_>,
    t: usize,
    np: usize,
    ng: usize,
    samples: Vec<f64>,
    stat: Option<serde_json::Value>,
    (mode, head): (Mode, bool),
    now: Option<(f64, f64)>,
) -> Row {
    let (avg, sd) = mean_sd(&samples);
    let pick = |(decode, prefill): (f64, f64)| if np > 0 { prefill } else { decode };
    Row {
        model: s.name.clone(),
        size_bytes: s.model.file.file_size(),
        params: s.model.n_params(),
        backend: format!("CPU ({})", e.tier().name()),
        threads: t,
        test: if np > 0 {
            format!("pp{np}")
        } else {
            format!("tg{ng}")
        },
        n_prompt: np,
        n_gen: ng,
        avg_ts: avg,
        stddev_ts: sd,
        samples_ts: samples,
        ffn: match mode {
            Mode::Dense => "dense".into(),
            Mode::Sparse => "sparse".into(),
            Mode::Offload(j) => format!("sparse@{}", s.budgets[j].label),
        },
        head: if head { "sparse" } else { "dense" },
        head_stats: stat.as_ref().and_then(|v| v.get("head").cloned()),
        sparse: stat.filter(|_| mode != Mode::Dense),
        predicted_ts: s
            .applied
            .as_ref()
            .map(|ap| pick((ap.plan.predicted.decode_tps, ap.plan.predicted.prefill_tps))),
        predicted_now_ts: now.map(pick),
    }
}

/// One markdown row (the header first).
fn print_row(row: &Row, first: bool, planned: bool) {
    if first {
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
        match row.head {
            "sparse" => format!("{} +head", row.ffn),
            _ => row.ffn.clone(),
        },
        row.test,
        row.avg_ts,
        row.stddev_ts
    );
}
