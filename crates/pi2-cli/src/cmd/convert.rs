//! `pi2 convert`: a model re-laid out as hot-first neuron bundles, with predictors and thresholds
//! (mixture-of-experts models: every expert's neurons, no predictors).

use pi2_runtime::sparse::{check_sparsity, thresholds};

fn parse_type(name: &str) -> pi2_runtime::Result<pi2_kernels::QuantType> {
    pi2_runtime::options::parse_type("--down-type", name)
}
use super::{engine, load_model, model_path};
use crate::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use pi2_convert::{self as convert, ConvertConfig};
use pi2_model::Model;
use pi2_sparse::{FitConfig, PredictorKind, Profile};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// How `convert` orders neurons in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Placement {
    Coactivation,
    Frequency,
}

#[derive(Args)]
pub struct ConvertArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Activation profile of this model (from `pi2 profile`; not used for mixture-of-experts
    /// models, whose experts are counted during calibration)
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Calibration text the predictors are fitted on (never the text you evaluate on)
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Calibration tokens (the last 20% are held out)
    #[arg(long, default_value_t = 4096)]
    pub tokens: usize,
    /// Tokens per calibration chunk (each from an empty cache)
    #[arg(long, default_value_t = 512)]
    pub chunk: usize,
    /// FFN sparsity: `auto` chooses it per layer from each layer's measured sensitivity, for the
    /// fewest bytes within --max-ppl-increase; a number sets one level for every layer (0..0.95)
    #[arg(long, default_value = "auto")]
    pub sparsity: String,
    /// With --sparsity auto: the largest perplexity increase over the dense model allowed on the
    /// held-out calibration tokens, in percent
    #[arg(long, default_value_t = 3.0)]
    pub max_ppl_increase: f32,
    /// With --sparsity auto: calibration tokens each layer's sensitivity is measured on
    #[arg(long, default_value_t = 256)]
    pub sensitivity_tokens: usize,
    /// Predictor: lowrank (training-free, fast), trained, or none (every gate row computed).
    /// Default: lowrank for ReLU-family FFNs, none for SiLU and GELU ones (their predictors keep
    /// most neurons as candidates, and their misses would cost quality the --sparsity auto check
    /// does not see); mixture-of-experts models take none only
    #[arg(long)]
    pub predictor: Option<String>,
    /// Mixture-of-experts models: confirm threshold of every layer (default 0, exact for
    /// ReLU-family FFNs)
    #[arg(long)]
    pub threshold: Option<f32>,
    /// Recall the predictor cut is set for on the held-out tokens
    #[arg(long, default_value_t = 0.97)]
    pub recall: f32,
    /// Largest predictor rank tried (multiples of 32)
    #[arg(long, default_value_t = 192)]
    pub max_rank: usize,
    /// Type of the transposed down rows (default: the model's down type)
    #[arg(long)]
    pub down_type: Option<String>,
    /// I/O granule the tensors are aligned to (bytes, power of two)
    #[arg(long, default_value_t = 4096)]
    pub granule: u32,
    /// Build a sparse output head: decode computes exactly only the output rows that could
    /// be the sampled token, proven by a bound (it falls back to the whole matrix when the
    /// bound cannot separate; see the README)
    #[arg(long)]
    pub head: bool,
    /// Share of the output matrix the sparse head's resident factors may take (0..1)
    #[arg(long, default_value_t = 0.10)]
    pub head_share: f32,
    /// Neuron order in the file: `coactivation` (hot first, and inside bands of 512 of that
    /// order each neuron next to the one it fires with most often: fewer pages read per
    /// token) or `frequency` (hot first alone)
    #[arg(long, value_enum, default_value_t = Placement::Coactivation)]
    pub placement: Placement,
    /// Output GGUF file
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Replace the output file if it exists
    #[arg(long)]
    pub force: bool,
}

/// How the thresholds are chosen.
enum SparsityChoice {
    Uniform(f32),
    /// Per layer by sensitivity, within this perplexity increase (0.03: +3%).
    Auto(f64),
}

fn sparsity_choice(a: &ConvertArgs) -> Result<SparsityChoice> {
    if a.sparsity != "auto" {
        let s: f32 =
            a.sparsity.parse().ok().with_context(|| {
                format!("--sparsity `{}`: expected auto or a number", a.sparsity)
            })?;
        return Ok(SparsityChoice::Uniform(check_sparsity(s)?));
    }
    if !(a.max_ppl_increase > 0.0 && a.max_ppl_increase <= 100.0) {
        bail!(
            "--max-ppl-increase {} is outside 0..100 (percent)",
            a.max_ppl_increase
        );
    }
    if !(16..=1 << 16).contains(&a.sensitivity_tokens) {
        bail!(
            "--sensitivity-tokens {} is outside 16..65536",
            a.sensitivity_tokens
        );
    }
    Ok(SparsityChoice::Auto(f64::from(a.max_ppl_increase) / 100.0))
}

pub fn run(a: ConvertArgs) -> Result<()> {
    let choice = sparsity_choice(&a)?;
    if !(a.head_share > 0.0 && a.head_share < 1.0) {
        bail!("--head-share {} is outside 0..1", a.head_share);
    }
    if !(0.5..=1.0).contains(&a.recall) {
        bail!("--recall {} is outside 0.5..1", a.recall);
    }
    let parse_predictor = |k: &str| -> Result<Option<PredictorKind>> {
        match k {
            "none" => Ok(None),
            k => Ok(Some(PredictorKind::from_name(k).with_context(|| {
                format!("unknown predictor `{k}` (lowrank, trained, none)")
            })?)),
        }
    };
    if let Some(k) = a.predictor.as_deref() {
        parse_predictor(k)?;
    }
    let input = model_path(&a.model)?;
    // Refuse early, before minutes of work.
    let inputs: Vec<&Path> = [
        Some(input.as_path()),
        Some(a.file.as_path()),
        a.profile.as_deref(),
    ]
    .into_iter()
    .flatten()
    .collect();
    super::check_outputs(&[&a.output], &inputs, a.force)?;
    let model = load_model(&a.model)?;
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("cannot read {}", a.file.display()))?;
    let mut tokens = model.tokenizer.encode(&text, false, false);
    tokens.truncate(a.tokens);
    if tokens.len() < 64 {
        bail!(
            "{} has only {} tokens; calibration needs at least 64",
            a.file.display(),
            tokens.len()
        );
    }
    if model.config.n_expert > 0 {
        return run_moe(&a, &model, &input, &tokens);
    }
    let Some(profile_path) = &a.profile else {
        bail!("--profile is required (make one with `pi2 profile`)");
    };
    let predictor_name =
        a.predictor
            .as_deref()
            .unwrap_or(match model.config.ffn_act.exact_sparsity() {
                true => "lowrank",
                false => "none",
            });
    let predictor = parse_predictor(predictor_name)?;
    let profile = Profile::load(profile_path)?;
    profile
        .model
        .check_compatible(&super::profile::model_info(&model, &input))
        .with_context(|| format!("profile {}", profile_path.display()))?;
    let t0 = Instant::now();
    let mut eng = engine(&model, &a.model)?;
    let (th, sparsity) = match choice {
        SparsityChoice::Uniform(s) => (thresholds(&profile, s)?, s),
        SparsityChoice::Auto(max_increase) => {
            let quality = convert::sensitivity::QualityTarget {
                max_increase,
                chunk: a.chunk,
                ..Default::default()
            };
            let th = auto_thresholds(&a, &model, &profile, &mut eng, &tokens, &quality)?;
            eprintln!(
                "convert: sparsity chosen in {:.1} s",
                t0.elapsed().as_secs_f64()
            );
            th
        }
    };
    let bar = ProgressBar::new(tokens.len() as u64).with_style(
        ProgressStyle::with_template("calibrating {bar:30} {pos}/{len} tokens {eta}").unwrap(),
    );
    let samples = convert::collect_samples(&mut eng, &tokens, a.chunk, &th, |d| {
        bar.set_position(d as u64)
    })?;
    bar.finish_and_clear();
    drop(eng);
    eprintln!(
        "convert: {} calibration tokens in {:.1} s; fitting {} predictors ..",
        tokens.len(),
        t0.elapsed().as_secs_f64(),
        predictor_name
    );
    let cfg = ConvertConfig {
        sparsity,
        predictor,
        down_type: a.down_type.as_deref().map(parse_type).transpose()?,
        granule: a.granule,
        held_out: HELD_OUT,
        fit: FitConfig {
            target_recall: a.recall,
            max_rank: a.max_rank,
            ..FitConfig::default()
        },
        head_share: a.head.then_some(a.head_share),
        placement_band: match a.placement {
            Placement::Coactivation => pi2_sparse::PLACEMENT_BAND,
            Placement::Frequency => 1,
        },
    };
    let t1 = Instant::now();
    let (writer, report) = convert::convert(&model, &profile, &th, samples, &cfg)?;
    eprintln!("convert: fitted in {:.1} s", t1.elapsed().as_secs_f64());
    // Verified before it gets its name: a file that fails is never seen (nor replaces one).
    convert::write_verified(&writer, &model, &a.output, &input, a.force)
        .context("the converted file was not written")?;
    drop(writer);
    let written =
        Model::load(&a.output).with_context(|| format!("cannot re-read {}", a.output.display()))?;
    let head = report.head;
    let report = report.layers;
    print_report(&report, head, a.head);
    eprintln!(
        "convert: wrote and verified {} ({:.1} MB) in {:.1} s",
        a.output.display(),
        written.file.file_size() as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The per-layer table of what `convert` chose, and the sparse head's size.
fn print_report(
    report: &[convert::LayerReport],
    head: Option<convert::HeadReport>,
    asked_head: bool,
) {
    println!("layer  threshold  fired  rank  recall  candidates");
    for (i, r) in report.iter().enumerate() {
        println!(
            "{i:>5}  {:>9.4}  {:>5.3}  {:>4}  {:>6.3}  {:>10.3}",
            r.threshold, r.fired, r.rank, r.recall, r.candidates
        );
    }
    let n = report.len() as f32;
    println!(
        "mean   {:>9}  {:>5.3}  {:>4.0}  {:>6.3}  {:>10.3}",
        "",
        report.iter().map(|r| r.fired).sum::<f32>() / n,
        report.iter().map(|r| r.rank as f32).sum::<f32>() / n,
        report.iter().map(|r| r.recall).sum::<f32>() / n,
        report.iter().map(|r| r.candidates).sum::<f32>() / n
    );
    match head {
        Some(h) => println!(
            "sparse head: rank {}, {} bound groups, {:.1} MB resident ({:.1}% of the output matrix)",
            h.rank,
            h.groups,
            h.bytes as f64 / 1e6,
            100.0 * h.bytes as f64 / h.output_bytes as f64
        ),
        None if !asked_head => {}
        None => println!("sparse head: none (the output matrix's width is not a multiple of 32 of at least 64)"),
    }
}

/// Per-layer thresholds from measured sensitivity (`--sparsity auto`), printed as a table; and
/// the mean sparsity.
fn auto_thresholds(
    a: &ConvertArgs,
    model: &Model,
    profile: &Profile,
    eng: &mut pi2_engine::Engine<'_>,
    tokens: &[pi2_model::TokenId],
    quality: &convert::sensitivity::QualityTarget,
) -> Result<(Vec<f32>, f32)> {
    let held = tokens.len() - (tokens.len() as f32 * (1.0 - HELD_OUT)) as usize;
    let tuning = &tokens[..a.sensitivity_tokens.min(tokens.len() - held)];
    let held_out = &tokens[tokens.len() - held..];
    let bytes: Vec<f64> = model
        .weights
        .layers
        .iter()
        .map(|l| (l.up.bytes(&model.file) + l.down.bytes(&model.file)) as f64)
        .collect();
    let bar = ProgressBar::new(0)
        .with_style(ProgressStyle::with_template("{msg} {bar:30} {pos}/{len} {eta}").unwrap());
    let c = convert::sensitivity::choose_sparsity(
        eng,
        profile,
        tuning,
        held_out,
        &bytes,
        quality,
        |what, done, total| {
            bar.set_message(what.to_string());
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        },
    )?;
    bar.finish_and_clear();
    println!(
        "sensitivity (KL divergence from dense, nats/token, {} tokens; one layer sparse at a time):",
        c.sensitivity.tokens
    );
    let levels: Vec<String> = c
        .sensitivity
        .levels
        .iter()
        .map(|s| format!("{s:>7.2}"))
        .collect();
    println!("layer  {}  chosen  threshold", levels.join(" "));
    for (l, kl) in c.sensitivity.kl.iter().enumerate() {
        let row: Vec<String> = kl.iter().map(|v| format!("{v:>7.4}")).collect();
        println!(
            "{l:>5}  {}  {:>6.2}  {:>9.4}",
            row.join(" "),
            c.sparsity[l],
            c.thresholds[l]
        );
    }
    let mean = c.sparsity.iter().sum::<f32>() / c.sparsity.len().max(1) as f32;
    println!(
        "held-out perplexity ({} tokens): dense {:.4}, sparse {:.4} ({:+.2}%, limit {:+.1}%); mean sparsity {:.3}; {} held-out checks",
        held_out.len(),
        c.dense_ppl,
        c.sparse_ppl,
        100.0 * (c.sparse_ppl / c.dense_ppl - 1.0),
        100.0 * quality.max_increase,
        mean,
        c.budgets.len()
    );
    Ok((c.thresholds, mean))
}

/// Share of the calibration tokens held out (predictor cuts, the quality check).
const HELD_OUT: f32 = 0.2;

/// Mixture-of-experts conversion: count every expert's neurons on the calibration tokens, write
/// each expert hot-first (streamed), verify, and report per layer.
fn run_moe(
    a: &ConvertArgs,
    model: &Model,
    input: &Path,
    tokens: &[pi2_model::TokenId],
) -> Result<()> {
    let c = &model.config;
    if a.predictor.as_deref().is_some_and(|p| p != "none") {
        bail!(
            "mixture-of-experts models convert without predictors (--predictor none): the router \
             picks the experts and a ReLU-family FFN's activity is exact"
        );
    }
    let threshold = match a.threshold {
        Some(t) if t.is_finite() && t >= 0.0 => t,
        Some(t) => bail!("--threshold {t} must be a number >= 0"),
        None if c.ffn_act.exact_sparsity() => 0.0,
        None => bail!(
            "this mixture-of-experts model has a {} FFN, whose activity is not exact: pass \
             --threshold",
            c.ffn_act.name()
        ),
    };
    let th = vec![threshold; c.n_layer];
    let t0 = Instant::now();
    let mut eng = engine(model, &a.model)?;
    let bar = ProgressBar::new(tokens.len() as u64).with_style(
        ProgressStyle::with_template("calibrating {bar:30} {pos}/{len} tokens {eta}").unwrap(),
    );
    let counts = convert::moe::count_experts(&mut eng, tokens, a.chunk, &th, |d| {
        bar.set_position(d as u64)
    })?;
    bar.finish_and_clear();
    drop(eng);
    eprintln!(
        "convert: {} calibration tokens through {} layers x {} experts in {:.1} s; writing ..",
        tokens.len(),
        c.n_layer,
        c.n_expert,
        t0.elapsed().as_secs_f64()
    );
    let cfg = ConvertConfig {
        sparsity: 0.0,
        predictor: None,
        down_type: a.down_type.as_deref().map(parse_type).transpose()?,
        granule: a.granule,
        ..ConvertConfig::default()
    };
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("writing {bar:30} {pos}/{len} tensors {eta}").unwrap(),
    );
    convert::moe::convert(
        model,
        &counts,
        &th,
        &cfg,
        &a.output,
        input,
        a.force,
        |i, n| {
            bar.set_length(n as u64);
            bar.set_position(i as u64);
        },
    )?;
    bar.finish_and_clear();
    let written =
        Model::load(&a.output).with_context(|| format!("cannot re-read {}", a.output.display()))?;
    super::profile::print_expert_counts(model, &counts);
    eprintln!(
        "convert: wrote and verified {} ({:.1} MB) in {:.1} s",
        a.output.display(),
        written.file.file_size() as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
