//! `pi2 profile`: run the dense model over calibration text and record how its FFN neurons
//! activate (see `pi2_sparse::Profile`), with two pictures.

use super::{engine, load_model};
use crate::args::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use pi2_model::Model;
use pi2_sparse::Profile;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Calibration text (keep it apart from evaluation text); default: the built-in mix of
    /// prose, Python source and chat turns in the model's template
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Tokens to profile (memory: one byte per token, layer and FFN neuron)
    #[arg(long, default_value_t = 4096)]
    pub tokens: usize,
    /// Tokens per chunk; each chunk starts with an empty context, as in perplexity runs
    #[arg(long = "chunk", default_value_t = 512)]
    pub chunk: usize,
    /// Sparsity at which "active" is decided for frequencies, co-activation, trace and cache
    /// curves (default: 0.5; for ReLU-family models "active" is "activation > 0" unless given)
    #[arg(long = "sparsity")]
    pub sparsity: Option<f32>,
    /// Output profile (JSON); the trace and pictures go next to it
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Replace existing output files
    #[arg(long)]
    pub force: bool,
}

/// The profile's companions: `<stem>.trace`, `<stem>-hotness.svg`, `<stem>-hitrate.svg`.
pub fn companions(output: &Path) -> [PathBuf; 3] {
    let stem = output.with_extension("");
    let s = stem.display();
    [
        PathBuf::from(format!("{s}.trace")),
        PathBuf::from(format!("{s}-hotness.svg")),
        PathBuf::from(format!("{s}-hitrate.svg")),
    ]
}

pub fn run(a: ProfileArgs) -> Result<()> {
    if let Some(s) = a.sparsity.filter(|s| !(0.0..1.0).contains(s)) {
        bail!("--sparsity must be in 0..1 (got {s})");
    }
    if a.tokens == 0 || a.chunk == 0 {
        bail!("--tokens and --chunk must be at least 1");
    }
    let [trace_path, hot_svg, hit_svg] = companions(&a.output);
    let path = super::model_path(&a.model)?;
    let inputs: Vec<&Path> = std::iter::once(path.as_path())
        .chain(a.file.as_deref())
        .collect();
    super::check_outputs(
        &[&a.output, &trace_path, &hot_svg, &hit_svg],
        &inputs,
        a.force,
    )?;
    let model = load_model(&a.model)?;
    let c = &model.config;
    let mut engine = engine(&model, &a.model)?;
    let (tokens, name) = calibration_tokens(&model, a.file.as_deref(), a.tokens)?;
    let n = tokens.len();
    if n < a.tokens {
        eprintln!("profile: the calibration text has only {n} tokens; profiling all of them");
    }
    let chunk = a.chunk.min(engine.n_ctx());
    eprintln!(
        "profile: {n} tokens of {name} in chunks of {chunk}, {} layers x {} neurons ({:.0} MiB of scores)",
        c.n_layer,
        c.n_ff,
        (n * c.n_layer * c.n_ff) as f64 / (1 << 20) as f64
    );
    if c.n_expert > 0 {
        return profile_experts(&a, &model, &tokens, chunk, engine);
    }
    let opts = pi2_convert::pipeline::ProfileOptions {
        chunk,
        sparsity: a.sparsity,
        calibration: name,
    };
    let start = std::time::Instant::now();
    let mut bar = Bars::default();
    let (profile, trace) = pi2_convert::pipeline::profile(
        &model,
        &path,
        &mut engine,
        &tokens,
        &opts,
        &mut |w, d, t| bar.show(w, d, t),
    )?;
    drop(bar);
    eprintln!(
        "profile: profiled and summarised in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    if let Some(spec) = pi2_model::stand_in::StandInSpec::from_file(&model.file) {
        print_planted(&spec, &profile);
    }
    profile.save(&a.output)?;
    trace.write(&trace_path)?;
    pi2_sparse::plots::hotness_svg(&profile, &hot_svg)?;
    pi2_sparse::plots::hit_rate_svg(&profile, &hit_svg)?;
    print_summary(&profile);
    for p in [&a.output, &trace_path, &hot_svg, &hit_svg] {
        eprintln!("profile: wrote {}", p.display());
    }
    Ok(())
}

/// Up to `n` calibration tokens: of `file`, or of the built-in text; and its name.
pub fn calibration_tokens(
    model: &Model,
    file: Option<&Path>,
    n: usize,
) -> Result<(Vec<pi2_model::TokenId>, String)> {
    let Some(f) = file else {
        let toks = pi2_convert::calibration::builtin_tokens(model, n)?;
        return Ok((toks, "the built-in calibration text".into()));
    };
    let text =
        std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?;
    let mut toks = model.tokenizer.encode(&text, false, false);
    toks.truncate(n);
    let name = f
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok((toks, name))
}

/// One progress bar per phase of a pipeline (`(phase, done, total)`), cleared when done; the
/// time each phase took.
#[derive(Default)]
pub struct Bars {
    bar: Option<(String, ProgressBar)>,
    started: Option<std::time::Instant>,
    times: Vec<(String, f64)>,
}

impl Bars {
    pub fn show(&mut self, phase: &str, done: usize, total: usize) {
        if self.bar.as_ref().is_none_or(|(p, _)| p != phase) {
            if let Some((p, b)) = self.bar.take() {
                b.finish_and_clear();
                let secs = self.started.map_or(0.0, |t| t.elapsed().as_secs_f64());
                self.times.push((p, secs));
            }
            self.started = Some(std::time::Instant::now());
            let b = ProgressBar::new(total as u64).with_style(
                ProgressStyle::with_template("{msg:>15} {bar:30} {pos}/{len} {eta}")
                    .expect("valid template"),
            );
            b.set_message(phase.to_string());
            self.bar = Some((phase.to_string(), b));
        }
        if let Some((_, b)) = &self.bar {
            b.set_length(total as u64);
            b.set_position(done as u64);
        }
    }
}

impl Bars {
    /// Seconds per phase so far ("profile 27.3 s, sensitivity 88.1 s, ..."), the last included.
    pub fn summary(&mut self) -> String {
        if let Some((p, b)) = self.bar.take() {
            b.finish_and_clear();
            let secs = self.started.map_or(0.0, |t| t.elapsed().as_secs_f64());
            self.times.push((p, secs));
        }
        let parts: Vec<String> = self
            .times
            .iter()
            .map(|(p, s)| format!("{p} {s:.1} s"))
            .collect();
        parts.join(", ")
    }
}

impl Drop for Bars {
    fn drop(&mut self) {
        if let Some((_, b)) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

/// Mixture-of-experts models: count every expert's neurons over the tokens (per unit: tokens
/// routed, and per neuron the tokens on which it fired), print the per-layer summary and write
/// the counts as JSON. Co-activation, traces and cache curves are per dense layer and are not
/// made for experts.
fn profile_experts(
    a: &ProfileArgs,
    model: &Model,
    tokens: &[pi2_model::TokenId],
    chunk: usize,
    mut engine: pi2_engine::Engine<'_>,
) -> Result<()> {
    let c = &model.config;
    let threshold = match a.sparsity {
        None if c.ffn_act.exact_sparsity() => 0.0,
        _ => bail!(
            "profiling a mixture-of-experts model counts exact activity only: it needs a \
             ReLU-family FFN and no --sparsity"
        ),
    };
    let pb = ProgressBar::new(tokens.len() as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} tokens, {per_sec}, eta {eta}")
            .expect("valid template"),
    );
    let th = vec![threshold; c.n_layer];
    let counts = pi2_convert::moe::count_experts(&mut engine, tokens, chunk, &th, |d| {
        pb.set_position(d as u64)
    })?;
    pb.finish_and_clear();
    print_expert_counts(model, &counts);
    let json = counts.to_json(model);
    std::fs::write(&a.output, serde_json::to_vec(&json)?)
        .with_context(|| format!("cannot write {}", a.output.display()))?;
    eprintln!("profile: wrote {}", a.output.display());
    Ok(())
}

/// Per layer of a mixture-of-experts model: how tokens spread over experts and how many of an
/// expert's neurons fire per routed token; for stand-ins, against the planted rates.
pub fn print_expert_counts(model: &Model, counts: &pi2_convert::moe::ExpertCounts) {
    let spec = pi2_model::stand_in::StandInSpec::from_file(&model.file);
    let ne = counts.experts;
    println!(
        "layer | routed share min..max | active rate (mean over used experts){}",
        if spec.is_some() {
            " | planted | correlation (mean)"
        } else {
            ""
        }
    );
    for li in 0..counts.fired.len() / ne {
        let units = li * ne..(li + 1) * ne;
        let total: u64 = counts.routed[units.clone()].iter().sum();
        let share = |u: usize| counts.routed[u] as f64 / total.max(1) as f64;
        let (lo, hi) = units
            .clone()
            .map(share)
            .fold((1.0f64, 0.0f64), |(l, h), s| (l.min(s), h.max(s)));
        // Experts no token was routed to have no measured rates.
        let used: Vec<usize> = units.filter(|&u| counts.routed[u] > 0).collect();
        let k = used.len().max(1) as f64;
        let rate = used.iter().map(|&u| counts.active_rate(u)).sum::<f64>() / k;
        print!("{li:>5} | {lo:>9.3}..{hi:<9.3} | {rate:>36.3}");
        if let Some(spec) = &spec {
            let (mut planted, mut corr) = (0.0, 0.0);
            for &u in &used {
                let p = spec.planted_rates(li, u % ne);
                let routed = counts.routed[u].max(1) as f32;
                let m: Vec<f32> = counts.fired[u].iter().map(|&n| n as f32 / routed).collect();
                planted += p.iter().map(|&x| x as f64).sum::<f64>() / p.len() as f64;
                corr += correlation(&p, &m);
            }
            print!(" | {:>7.3} | {:>18.3}", planted / k, corr / k);
        }
        println!();
    }
}

fn correlation(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len() as f64;
    let mean = |v: &[f32]| v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let (ma, mb) = (mean(a), mean(b));
    let cov: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - ma) * (y as f64 - mb))
        .sum();
    let var = |v: &[f32], m: f64| v.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>();
    cov / (var(a, ma) * var(b, mb)).sqrt()
}

/// A stand-in model's planted firing rates against the measured ones (fraction of tokens
/// with a positive gate, read from the profile at "active" = not zero).
fn print_planted(spec: &pi2_model::stand_in::StandInSpec, p: &Profile) {
    println!(
        "planted vs measured firing rates ({}, alpha {}):",
        spec.shape.name, spec.alpha
    );
    println!(
        "layer | mean planted | mean measured | correlation | top 20% share planted / measured"
    );
    for (li, l) in p.layers.iter().enumerate() {
        let planted = spec.planted_rates(li, 0);
        let measured = &l.frequency;
        let n = planted.len() as f64;
        let mean = |v: &[f32]| v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let (mp, mm) = (mean(&planted), mean(measured));
        let corr = correlation(&planted, measured);
        let top_share = |v: &[f32]| {
            let mut s = v.to_vec();
            s.sort_by(|a, b| b.total_cmp(a));
            let total: f32 = s.iter().sum();
            s[..s.len() / 5].iter().sum::<f32>() / total.max(1e-9)
        };
        println!(
            "{li:>5} | {mp:>12.3} | {mm:>13.3} | {corr:>11.3} | {:.2} / {:.2}",
            top_share(&planted),
            top_share(measured)
        );
    }
}

fn print_summary(p: &Profile) {
    println!(
        "layer | threshold@{:.0}% | neurons active >50% of tokens | >90% | never | co-act lift | hit@25% (lru / pinned / best)",
        p.reference_sparsity * 100.0
    );
    for (i, l) in p.layers.iter().enumerate() {
        let n = l.frequency.len() as f32;
        let frac = |pred: &dyn Fn(f32) -> bool| {
            l.frequency.iter().filter(|&&f| pred(f)).count() as f32 / n * 100.0
        };
        let h = l
            .hit_rate
            .iter()
            .find(|h| (h.cache_fraction - 0.25).abs() < 1e-6);
        println!(
            "{i:>5} | {:>14.4} | {:>28.1}% | {:>3.1}% | {:>4.1}% | {:>11.1} | {}",
            l.reference_threshold,
            frac(&|f| f > 0.5),
            frac(&|f| f > 0.9),
            frac(&|f| f == 0.0),
            l.coactivation.mean_lift,
            h.map_or("-".into(), |h| format!(
                "{:.2} / {:.2} / {:.2}",
                h.lru, h.pinned, h.best
            )),
        );
    }
}
