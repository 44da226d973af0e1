//! `pi2 convert`: a model re-laid out as hot-first neuron bundles, with predictors and thresholds
//! (mixture-of-experts models: every expert's neurons, no predictors).

fn parse_type(name: &str) -> pi2_runtime::Result<pi2_kernels::QuantType> {
    pi2_runtime::options::parse_type("--down-type", name)
}
use super::{load_model, model_path};
use crate::args::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use pi2_convert::pipeline::{self, ConvertOptions, Sparsity};
use pi2_convert::{self as convert, ConvertConfig};
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
    /// Calibration text the thresholds and predictors are fitted on (never the text you
    /// evaluate on); default: the built-in mix of prose, Python source and chat turns
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
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
    #[arg(long, default_value_t = 1.5)]
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
    /// Type of the transposed down rows (default: the model's down type, or the smallest type at
    /// least as precise that rows of the model's width can hold: Q5_0 for Q4_K sources)
    #[arg(long)]
    pub down_type: Option<String>,
    /// I/O granule the tensors are aligned to (bytes, power of two)
    #[arg(long, default_value_t = 4096)]
    pub granule: u32,
    /// Keep the output matrix as it is: no clustered head (decode then computes every output
    /// row every token)
    #[arg(long)]
    pub no_head: bool,
    /// Output rows per cluster of the clustered head (a multiple of 8)
    #[arg(long, default_value_t = 16)]
    pub head_cluster: usize,
    /// Share of the output rows the clustered head computes exactly by default, in (0, 1]
    #[arg(long, default_value_t = 0.4)]
    pub head_share: f32,
    /// Type the clustered head's output rows are stored in (q8_0, q5_0, q4_0, ...; default:
    /// the model's): fewer bytes read per chosen cluster under a memory budget, at some quality
    #[arg(long, conflicts_with = "no_head")]
    pub head_type: Option<String>,
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

/// The pipeline's options from the arguments, every one checked.
fn options(a: &ConvertArgs) -> Result<ConvertOptions> {
    let sparsity = match a.sparsity.as_str() {
        "auto" => Sparsity::Auto {
            max_increase: f64::from(a.max_ppl_increase) / 100.0,
            sensitivity_tokens: a.sensitivity_tokens,
        },
        s => Sparsity::Uniform(
            s.parse()
                .ok()
                .with_context(|| format!("--sparsity `{s}`: expected auto or a number"))?,
        ),
    };
    let predictor = match a.predictor.as_deref() {
        None => None,
        Some("none") => Some(None),
        Some(k) => Some(Some(PredictorKind::from_name(k).with_context(|| {
            format!("unknown predictor `{k}` (lowrank, trained, none)")
        })?)),
    };
    let opts = ConvertOptions {
        chunk: a.chunk,
        sparsity,
        predictor,
        fit: FitConfig {
            target_recall: a.recall,
            max_rank: a.max_rank,
            ..FitConfig::default()
        },
        layout: ConvertConfig {
            down_type: a.down_type.as_deref().map(parse_type).transpose()?,
            granule: a.granule,
            head: (!a.no_head).then_some(convert::head::HeadConfig {
                cluster: a.head_cluster,
                share: a.head_share,
                row_type: (a.head_type.as_deref())
                    .map(|t| pi2_runtime::options::parse_type("--head-type", t))
                    .transpose()?,
                ..Default::default()
            }),
            placement_band: match a.placement {
                Placement::Coactivation => pi2_sparse::PLACEMENT_BAND,
                Placement::Frequency => 1,
            },
            ..ConvertConfig::default()
        },
        expert_threshold: a.threshold,
    };
    opts.check()?;
    Ok(opts)
}

pub fn run(a: ConvertArgs) -> Result<()> {
    let opts = options(&a)?;
    let input = model_path(&a.model)?;
    // Refuse early, before minutes of work.
    let inputs: Vec<&Path> = [
        Some(input.as_path()),
        a.file.as_deref(),
        a.profile.as_deref(),
    ]
    .into_iter()
    .flatten()
    .collect();
    super::check_outputs(&[&a.output], &inputs, a.force)?;
    let model = load_model(&a.model)?;
    let (tokens, name) = pi2_convert::calibration::tokens(&model, a.file.as_deref(), a.tokens)?;
    let profile = match (&a.profile, model.config.n_expert) {
        (Some(p), 0) => Some(Profile::load(p).with_context(|| format!("profile {}", p.display()))?),
        (None, 0) => bail!("--profile is required (make one with `pi2 profile`)"),
        _ => None,
    };
    eprintln!("convert: {} tokens of {name}", tokens.len());
    let t0 = Instant::now();
    let own = pi2_runtime::memory::AnonPeak::start();
    let engine_cfg = super::engine_config(&a.model)?;
    let mut bars = super::profile::Bars::default();
    let done = pipeline::convert_file(
        &model,
        &input,
        profile.as_ref(),
        &tokens,
        &engine_cfg,
        &opts,
        &a.output,
        a.force,
        &mut |w, d, t| bars.show(w, d, t),
    )
    .with_context(|| format!("{} was not written", a.output.display()));
    drop(bars);
    let done = done?;
    if let Some(choice) = &done.choice {
        let held_out = opts.layout.held_out;
        println!(
            "{}",
            convert::describe::SensitivityTable { choice, held_out }
        );
    }
    if let Some(r) = &done.report {
        println!("{r}");
    }
    if let Some(counts) = &done.experts {
        super::profile::print_expert_counts(&model, counts);
    }
    eprintln!(
        "convert: wrote and verified {} ({:.1} MB) in {:.1} s{}",
        a.output.display(),
        done.bytes as f64 / 1e6,
        t0.elapsed().as_secs_f64(),
        pi2_runtime::open::peak_words(own.finish(), pi2_runtime::offload::peak_resident_bytes())
    );
    Ok(())
}
