//! Measurement in the style of llama-bench: prompt processing (ppN) and generation (tgN) from an
//! empty context, for every configuration ("mode") a model offers, each an engine built once
//! through the session layer. Repetitions run interleaved across modes (repetition 0 warms
//! up), so a slow phase of a shared machine hits every mode alike.
//!
//! Modes: the FFN dense, sparse in memory, and sparse under each memory budget; a converted
//! model with a clustered head runs its in-memory modes with the whole output matrix (the
//! dense head) and with the clustered head.

use crate::error::{Result, RuntimeError};
use crate::options::{parse_size, OffloadOptions};
use crate::plan::{bench_tokens, Applied};
use crate::session::{prepare, SessionOptions};
use pi2_engine::{ClusteredHead, Engine, EngineConfig, EngineParts, Logits, SparseFfn};
use pi2_model::Model;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What to measure.
#[derive(Clone, Debug, Default)]
pub struct BenchOptions {
    /// Prompt lengths (ppN) and generation lengths (tgN); 0 skips.
    pub n_prompt: Vec<usize>,
    pub n_gen: Vec<usize>,
    /// Timed repetitions per test (after one warm-up).
    pub reps: usize,
    /// Thread counts to sweep (empty: the session's).
    pub threads: Vec<usize>,
    /// Memory budgets, each a mode of its own (`48M`, `50%`).
    pub budgets: Vec<String>,
    /// Only the modes under a budget.
    pub offload_only: bool,
    /// With one budget: the ablation ladder, one mechanism added per mode.
    pub ablation: bool,
    /// Also measure speculative decoding: each generation length as greedy generation on an
    /// editing workload, without drafts and with these, up to `draft_max` tokens a pass.
    pub draft: Option<DraftKind>,
    pub draft_max: usize,
}

/// Where a bench's drafts come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftKind {
    /// Prompt lookup.
    Lookup,
    /// The model from what a memory budget keeps resident.
    SelfDraft,
}

impl DraftKind {
    fn name(self) -> &'static str {
        match self {
            DraftKind::Lookup => "lookup",
            DraftKind::SelfDraft => "self",
        }
    }
}

/// One measured row.
#[derive(Clone, Debug, Serialize)]
pub struct BenchRow {
    pub model: String,
    pub size_bytes: u64,
    pub params: u64,
    pub backend: String,
    pub threads: usize,
    pub test: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    pub samples_ts: Vec<f64>,
    /// `dense`, `sparse`, or `sparse@BUDGET`.
    pub ffn: String,
    /// `clustered` or `dense` (the whole output matrix).
    pub head: &'static str,
    /// The engine's counts over the last repetition (see [`crate::report::engine_json`]).
    pub stats: serde_json::Value,
    /// With a plan: its predicted tokens/s, and the same with the flash measured just before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_ts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_now_ts: Option<f64>,
}

impl BenchRow {
    /// The header of llama-bench's markdown table (with a plan: predicted columns too).
    pub fn markdown_header(planned: bool) -> String {
        let (names, rules) = match planned {
            true => (
                " predicted t/s | measured / predicted | predicted, flash now | measured / that |",
                " ---: | ---: | ---: | ---: |",
            ),
            false => ("", ""),
        };
        format!("| model | size | params | backend | threads | ffn | test | t/s |{names}\n| ----- | ---: | -----: | ------- | ------: | --- | ---: | --: |{rules}")
    }

    /// This row of llama-bench's markdown table.
    pub fn markdown(&self) -> String {
        let versus = self.predicted_ts.map_or(String::new(), |p| {
            let now = self.predicted_now_ts.map_or(" - | - |".into(), |n| {
                format!(" {n:.2} | {:.2} |", self.avg_ts / n)
            });
            format!(" {p:.2} | {:.2} |{now}", self.avg_ts / p)
        });
        let ffn = match self.head {
            "clustered" => format!("{} +head", self.ffn),
            _ => self.ffn.clone(),
        };
        format!(
            "| {} | {:.2} MiB | {:.2} M | {} | {} | {ffn} | {} | {:.2} ± {:.2} |{versus}",
            self.model,
            self.size_bytes as f64 / (1 << 20) as f64,
            self.params as f64 / 1e6,
            self.backend,
            self.threads,
            self.test,
            self.avg_ts,
            self.stddev_ts
        )
    }
}

/// How a mode's FFN runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ffn {
    Dense,
    Sparse,
    Offload(usize),
}

/// One offloaded configuration: label, budget, options, whether it runs at the least budget,
/// and its cluster size (the ablation ladder's rungs differ in these).
struct Budget {
    label: String,
    bytes: u64,
    options: OffloadOptions,
    least: bool,
    cluster: Option<usize>,
}

/// What every mode shares.
struct Setup<'m> {
    model: &'m Model,
    path: PathBuf,
    sparse: Option<SparseFfn<'m>>,
    head: Option<ClusteredHead<'m>>,
    applied: Option<Applied>,
    budgets: Vec<Budget>,
    modes: Vec<(Ffn, bool)>,
    base: EngineConfig,
}

/// Runs every test of `o` on `model` (at `path`) for every mode the session options and
/// budgets give; `on_row` sees each row as it is measured.
pub fn bench(
    model: &Model,
    path: &Path,
    session: &SessionOptions,
    o: &BenchOptions,
    mut on_row: impl FnMut(&BenchRow),
) -> Result<Vec<BenchRow>> {
    if o.reps == 0 {
        return Err(RuntimeError::option("--repetitions", "must be at least 1"));
    }
    if o.draft.is_some() {
        pi2_engine::DraftConfig::checked(o.draft_max, 1)
            .map_err(|e| RuntimeError::option("--draft-max", e.to_string()))?;
    }
    if o.draft == Some(DraftKind::SelfDraft) && o.budgets.is_empty() && session.plan.is_none() {
        return Err(RuntimeError::option(
            "--draft",
            "self drafts from what --mem-budget keeps resident: give --mem-budget (in memory a draft costs a whole step; use lookup)",
        ));
    }
    let setup = setup(model, path, session, o)?;
    let threads = match (&setup.applied, o.threads.is_empty()) {
        (Some(_), false) => {
            return Err(RuntimeError::option("--plan", "sets the threads; drop -t"))
        }
        (Some(_), true) | (None, true) => vec![setup.base.threads],
        (None, false) => o.threads.clone(),
    };
    let mut rows = Vec::new();
    for &t in &threads {
        if t == 0 {
            return Err(RuntimeError::option("--threads", "must be at least 1"));
        }
        for row in bench_threads(&setup, o, t)? {
            on_row(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}

fn setup<'m>(
    model: &'m Model,
    path: &Path,
    session: &SessionOptions,
    o: &BenchOptions,
) -> Result<Setup<'m>> {
    let file = model.file.file_size();
    let mut budgets = o
        .budgets
        .iter()
        .map(|b| {
            Ok(Budget {
                label: b.clone(),
                bytes: parse_size("--mem-budget", b, file)?,
                options: session.offload.clone(),
                least: false,
                cluster: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let opts = SessionOptions {
        mem_budget: o.budgets.first().cloned(),
        ..session.clone()
    };
    let prepared = prepare(model, path, &opts)?;
    let (sparse, head, applied) = (prepared.sparse, prepared.head, prepared.applied);
    if let Some(ap) = &applied {
        budgets = ap
            .offload
            .iter()
            .map(|c| Budget {
                label: "plan".into(),
                bytes: c.budget,
                options: session.offload.clone(),
                least: false,
                cluster: None,
            })
            .collect();
    }
    if o.ablation {
        if budgets.len() != 1 || applied.is_some() {
            return Err(RuntimeError::option(
                "--ablation",
                "needs exactly one --mem-budget and no --plan",
            ));
        }
        let sp = sparse.as_ref().ok_or_else(|| {
            RuntimeError::option("--ablation", "needs a model made by `pi2 convert`")
        })?;
        budgets = ladder(model, sp, &budgets[0]);
    }
    // `--dense-head` (a head share of 1) asks for the whole output matrix only: no rows with
    // the clustered head.
    let clustered = head.is_some() && session.engine.head_share != Some(1.0);
    let modes = modes(
        o,
        sparse.is_some(),
        crate::offload::streams_experts(model),
        clustered,
        budgets.len(),
        applied.is_some(),
    )?;
    let base = match &applied {
        Some(ap) => ap.cfg.clone(),
        None => session.engine.config()?,
    };
    Ok(Setup {
        model,
        path: path.to_path_buf(),
        sparse,
        head,
        applied,
        budgets,
        modes,
        base,
    })
}

/// The modes: dense, sparse in memory, sparse under each budget; in memory with each head
/// (the dense one first) when the model has a clustered head.
fn modes(
    o: &BenchOptions,
    sparse: bool,
    streams: bool,
    head: bool,
    n_budgets: usize,
    planned: bool,
) -> Result<Vec<(Ffn, bool)>> {
    let mut ffn = vec![Ffn::Dense];
    if sparse {
        ffn.push(Ffn::Sparse);
        ffn.extend((0..n_budgets).map(Ffn::Offload));
    } else if streams {
        // A plain mixture of experts: in memory, and its experts streamed under each budget.
        ffn.extend((0..n_budgets).map(Ffn::Offload));
    } else if n_budgets > 0 {
        return Err(RuntimeError::option(
            "--mem-budget",
            "reads FFN neurons from flash: it needs a model made by `pi2 convert`",
        ));
    }
    if o.offload_only || o.ablation {
        if n_budgets == 0 {
            return Err(RuntimeError::option("--offload-only", "needs --mem-budget"));
        }
        ffn.retain(|m| matches!(m, Ffn::Offload(_)));
    }
    if planned {
        // Only the plan's own configuration.
        ffn = vec![ffn.pop().expect("one mode at least")];
    }
    Ok(ffn
        .into_iter()
        .flat_map(|m| {
            let heads: &[bool] = match (head, m) {
                (false, _) => &[false],
                (true, Ffn::Offload(_)) => &[true],
                (true, _) => &[false, true],
            };
            heads.iter().map(move |&h| (m, h))
        })
        .collect())
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
    let full = b.options.clone();
    let naive = OffloadOptions {
        hot_share: 0.0,
        io_depth: Some(1),
        max_read: row.to_string(),
        merge_gap: "0".into(),
        ..full.clone()
    };
    let merged = OffloadOptions {
        max_read: full.max_read.clone(),
        merge_gap: full.merge_gap.clone(),
        ..naive.clone()
    };
    let cached = OffloadOptions {
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
    .map(|(n, options, least, cluster)| Budget {
        label: format!("{} {n}", b.label),
        bytes: b.bytes,
        options,
        least,
        cluster,
    })
    .collect()
}

/// The engine configuration for `t` threads with a context that holds the longest test.
fn thread_config(s: &Setup<'_>, o: &BenchOptions, t: usize) -> Result<EngineConfig> {
    let mut cfg = s.base.clone();
    cfg.threads = t;
    if o.draft.is_some() {
        // A checked draft's rows of logits (counted by a budget).
        cfg.logit_rows = cfg.logit_rows.max(o.draft_max + 1);
    }
    let mut longest = o
        .n_prompt
        .iter()
        .chain(&o.n_gen)
        .copied()
        .max()
        .unwrap_or(0);
    if o.draft.is_some() {
        // The editing prompt, the generation and a checked draft beyond it.
        let gen = o.n_gen.iter().copied().max().unwrap_or(0);
        longest = longest.max(editing_prompt(s.model).len() + gen + o.draft_max + 1);
    }
    if let Some(ap) = &s.applied {
        // The plan's memory was accounted for its context.
        if ap.plan.n_ctx <= longest {
            return Err(RuntimeError::option(
                "--plan",
                format!(
                    "is for a context of {} tokens; the tests need {} (plan with a larger -c)",
                    ap.plan.n_ctx,
                    longest + 1
                ),
            ));
        }
        cfg.n_ctx = ap.plan.n_ctx;
    } else if s.budgets.is_empty() {
        cfg.n_ctx = cfg.n_ctx.max(longest + 1);
    } else {
        // Under a budget the KV cache counts: hold only what the tests use.
        cfg.n_ctx = longest + 1;
    }
    Ok(cfg)
}

/// One engine per mode, built once.
fn engines<'s>(
    s: &'s Setup<'_>,
    cfg: &EngineConfig,
    max_batch: usize,
    process: u64,
) -> Result<Vec<Engine<'s>>> {
    let file = s.model.file.file_size();
    let mut out = Vec::new();
    for &(ffn, clustered) in &s.modes {
        let mut cfg = cfg.clone();
        if !clustered && s.head.is_some() {
            cfg.head_share = Some(1.0);
        }
        let (mut offload, mut experts) = (None, None);
        match ffn {
            Ffn::Offload(j) if s.sparse.is_none() => {
                let b = &s.budgets[j];
                let ocfg = b.options.config(b.bytes, file, &s.path)?;
                let ocfg = pi2_engine::OffloadConfig { process, ..ocfg };
                experts = Some(crate::offload::build_experts(
                    &ocfg, s.model, &s.path, &cfg, max_batch,
                )?);
            }
            Ffn::Offload(j) => {
                let b = &s.budgets[j];
                let sp = s
                    .sparse
                    .as_ref()
                    .expect("offload modes need the sparse FFN");
                cfg.cluster = b.cluster.unwrap_or(cfg.cluster);
                let (ocfg, n_batch) = match s
                    .applied
                    .as_ref()
                    .and_then(|ap| ap.offload.as_ref().map(|c| (c.clone(), ap.plan.n_batch)))
                {
                    Some(p) => p,
                    None => {
                        let bytes = match b.least {
                            true => {
                                crate::offload::min_budget(s.model, sp, &cfg, max_batch, process)?
                            }
                            false => b.bytes,
                        };
                        (b.options.config(bytes, file, &s.path)?, max_batch)
                    }
                };
                let ocfg = pi2_engine::OffloadConfig { process, ..ocfg };
                offload = Some(crate::offload::build(
                    &ocfg, s.model, &s.path, sp, &cfg, n_batch,
                )?);
            }
            _ => {}
        }
        let parts = EngineParts {
            sparse: if ffn == Ffn::Dense {
                None
            } else {
                s.sparse.as_ref()
            },
            head: s.head.as_ref(),
            offload,
            experts,
        };
        let mut e = Engine::with_parts(s.model, &cfg, parts)?;
        e.prepare();
        out.push(e);
    }
    Ok(out)
}

/// Every test at `t` threads.
fn bench_threads(s: &Setup<'_>, o: &BenchOptions, t: usize) -> Result<Vec<BenchRow>> {
    let cfg = thread_config(s, o, t)?;
    // Generation runs one token per pass: only prompts and checked drafts need batch buffers.
    let checked = if o.draft.is_some() {
        o.draft_max + 1
    } else {
        1
    };
    let max_batch = o.n_prompt.iter().copied().max().unwrap_or(0).max(checked);
    // Measured before the first offload, so later ones do not count earlier regions.
    let process = crate::offload::process_bytes(s.model);
    let mut engines = engines(s, &cfg, max_batch, process)?;
    let tests: Vec<(usize, usize)> = o
        .n_prompt
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| (n, 0))
        .chain(o.n_gen.iter().filter(|&&n| n > 0).map(|&n| (0, n)))
        .collect();
    let mut rows = Vec::new();
    for (np, ng) in tests {
        let now = match &s.applied {
            Some(ap) => crate::hardware::repredict_now(s.model, &s.path, &ap.plan, process)?,
            None => None,
        };
        let toks = bench_tokens(s.model, np.max(ng));
        let mut samples = vec![Vec::new(); engines.len()];
        let mut stats = vec![serde_json::Value::Null; engines.len()];
        for rep in 0..=o.reps {
            for (k, e) in engines.iter_mut().enumerate() {
                e.reset_stats();
                let t0 = Instant::now();
                let ts = match np > 0 {
                    true => time_prompt(e, &toks)?,
                    false => time_gen(e, &toks, ng)?,
                };
                stats[k] = crate::report::engine_json(e, np.max(ng), t0.elapsed().as_secs_f64());
                if rep > 0 {
                    samples[k].push(ts);
                }
            }
        }
        for (k, e) in engines.iter().enumerate() {
            rows.push(row(
                s,
                e,
                np,
                ng,
                &samples[k],
                stats[k].clone(),
                s.modes[k],
                now,
            ));
        }
    }
    if let Some(kind) = o.draft {
        for &ng in o.n_gen.iter().filter(|&&n| n > 0) {
            rows.extend(bench_drafts(s, o, &mut engines, ng, kind, max_batch)?);
        }
    }
    Ok(rows)
}

/// The editing workload drafts are measured on: a 40-line source file and the start of its
/// copy with one change (a plain completion, so every model's template fits it).
fn editing_prompt(model: &Model) -> Vec<u32> {
    let lines: Vec<&str> = pi2_convert::calibration::builtin_code().lines().collect();
    let start = (200..lines.len())
        .find(|&i| lines[i].starts_with("def "))
        .unwrap_or(0);
    let code = lines[start..(start + 40).min(lines.len())].join("\n");
    let text = format!(
        "Here is a Python file:\n```python\n{code}\n```\nThe same file with every `self` \
         parameter renamed to `this`:\n```python\n"
    );
    model.tokenizer.encode(&text, true, false)
}

/// Greedy generation of `ng` tokens on the editing workload in every mode, without drafts and
/// with `kind`'s, interleaved repetition by repetition: rows `genN` and `genN+KIND`, their
/// stats with the draft's counts.
fn bench_drafts(
    s: &Setup<'_>,
    o: &BenchOptions,
    engines: &mut [Engine<'_>],
    ng: usize,
    kind: DraftKind,
    n_batch: usize,
) -> Result<Vec<BenchRow>> {
    let prompt = editing_prompt(s.model);
    let mut samples = vec![[Vec::new(), Vec::new()]; engines.len()];
    let mut stats = vec![[serde_json::Value::Null, serde_json::Value::Null]; engines.len()];
    for rep in 0..=o.reps {
        for (k, e) in engines.iter_mut().enumerate() {
            if skips_drafts(s, k, kind) {
                continue;
            }
            for (d, drafts) in [false, true].into_iter().enumerate() {
                let g =
                    generate_greedy(e, &prompt, ng, drafts.then_some(kind), o.draft_max, n_batch)?;
                let secs = g.predicted_time.as_secs_f64();
                let mut st = crate::report::engine_json(e, g.tokens.len(), secs);
                st["draft"] = serde_json::json!({
                    "drafted": g.drafted,
                    "accepted": g.accepted,
                    "acceptance": g.accepted as f64 / g.drafted.max(1) as f64,
                    "tokens_per_pass": g.tokens.len() as f64 / g.decode_passes.max(1) as f64,
                });
                stats[k][d] = st;
                if rep > 0 {
                    samples[k][d].push(g.tokens.len() as f64 / secs);
                }
            }
        }
    }
    let mut rows = Vec::new();
    for (k, e) in engines.iter().enumerate() {
        if skips_drafts(s, k, kind) {
            continue;
        }
        for d in 0..2 {
            let mut r = row(
                s,
                e,
                0,
                ng,
                &samples[k][d],
                stats[k][d].clone(),
                s.modes[k],
                None,
            );
            r.test = match d {
                0 => format!("gen{ng}"),
                _ => format!("gen{ng}+{}", kind.name()),
            };
            rows.push(r);
        }
    }
    Ok(rows)
}

/// Self-drafts only where a budget keeps part of the model resident (in memory every draft
/// costs a whole step).
fn skips_drafts(s: &Setup<'_>, mode: usize, kind: DraftKind) -> bool {
    kind == DraftKind::SelfDraft && !matches!(s.modes[mode].0, Ffn::Offload(_))
}

/// `n` greedy tokens after `prompt` (end of generation ignored), with drafts of `kind`.
fn generate_greedy(
    e: &mut Engine<'_>,
    prompt: &[u32],
    n: usize,
    kind: Option<DraftKind>,
    draft_max: usize,
    n_batch: usize,
) -> Result<pi2_engine::Generation> {
    let mut sampler = pi2_engine::Sampler::new(pi2_engine::SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    });
    let cfg = pi2_engine::GenerateConfig {
        max_tokens: Some(n),
        ignore_eos: true,
        n_batch,
        draft: pi2_engine::DraftConfig {
            max: draft_max.max(1),
            min: 1,
        },
    };
    let (mut lookup, mut own) = (pi2_engine::Lookup::default(), pi2_engine::SelfDraft);
    let drafter: Option<&mut dyn pi2_engine::Drafter> = match kind {
        None => None,
        Some(DraftKind::Lookup) => Some(&mut lookup),
        Some(DraftKind::SelfDraft) => Some(&mut own),
    };
    e.truncate(0);
    let g = pi2_engine::generate_drafted(
        e,
        &mut sampler,
        &mut Vec::new(),
        prompt,
        &cfg,
        drafter,
        |_| true,
    )?;
    Ok(g)
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

/// Mean and sample standard deviation.
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    let var = match v.len() > 1 {
        true => v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() - 1) as f64,
        false => 0.0,
    };
    (mean, var.sqrt())
}

#[allow(clippy::too_many_arguments)]
fn row(
    s: &Setup<'_>,
    e: &Engine<'_>,
    np: usize,
    ng: usize,
    samples: &[f64],
    stats: serde_json::Value,
    (ffn, clustered): (Ffn, bool),
    now: Option<(f64, f64)>,
) -> BenchRow {
    let (avg, sd) = mean_sd(samples);
    let pick = |(decode, prefill): (f64, f64)| if np > 0 { prefill } else { decode };
    BenchRow {
        model: model_name(s.model),
        size_bytes: s.model.file.file_size(),
        params: s.model.n_params(),
        backend: format!("CPU ({})", e.tier().name()),
        threads: e.threads(),
        test: match np > 0 {
            true => format!("pp{np}"),
            false => format!("tg{ng}"),
        },
        n_prompt: np,
        n_gen: ng,
        avg_ts: avg,
        stddev_ts: sd,
        samples_ts: samples.to_vec(),
        ffn: match ffn {
            Ffn::Dense => "dense".into(),
            Ffn::Sparse => "sparse".into(),
            Ffn::Offload(j) => format!("sparse@{}", s.budgets[j].label),
        },
        head: if clustered { "clustered" } else { "dense" },
        stats,
        predicted_ts: s
            .applied
            .as_ref()
            .map(|ap| pick((ap.plan.predicted.decode_tps, ap.plan.predicted.prefill_tps))),
        predicted_now_ts: now.map(pick),
    }
}

/// "qwen2 630M Q5_0": architecture, parameters and the type holding the most bytes.
pub fn model_name(model: &Model) -> String {
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
