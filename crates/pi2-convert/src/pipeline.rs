//! The profile and conversion pipelines with plain options and a progress callback: what
//! `pi2 profile` and `pi2 convert` run, and what the one-command flow and any app run without
//! the command line.
//!
//! - [`profile`]: the dense model over calibration tokens, every layer's activations recorded
//!   into a `pi2_sparse::Profile` and its trace;
//! - [`convert_file`]: thresholds (chosen per layer by measured sensitivity, or one level),
//!   calibration samples, predictors, the clustered head, the written and verified file.
//!
//! Progress is reported as `(phase, done, total)`: phases are short names (`profile`,
//! `sensitivity`, `held-out check`, `calibrate`, `fit`, `write`).

use crate::sensitivity::{choose_sparsity, QualityChoice, QualityTarget};
use crate::{ConvertConfig, ConvertError, ConvertReport};
use pi2_engine::{Engine, EngineConfig, Logits};
use pi2_model::{Model, TokenId};
use pi2_sparse::{
    Calibration, FitConfig, ModelInfo, PredictorKind, Profile, ProfileConfig, Profiler, Trace,
};
use std::path::Path;

/// A progress callback: phase, done, total.
pub type Progress<'a> = &'a mut dyn FnMut(&str, usize, usize);

/// The description of `model` (at `path`) a profile records and is checked against.
pub fn model_info(model: &Model, path: &Path) -> ModelInfo {
    let c = &model.config;
    ModelInfo {
        architecture: c.arch.name().to_string(),
        n_layer: c.n_layer,
        n_embd: c.n_embd,
        n_ff: c.n_ff,
        activation: pi2_engine::profile_activation(c.ffn_act),
        file_name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        file_bytes: model.file.file_size(),
    }
}

/// How to profile.
#[derive(Clone, Debug)]
pub struct ProfileOptions {
    /// Tokens per chunk; each chunk starts with an empty context, as in perplexity runs.
    pub chunk: usize,
    /// The sparsity at which "active" is decided (frequencies, co-activation, trace, cache
    /// curves); `None`: 0.5, or "activation > 0" for ReLU-family models.
    pub sparsity: Option<f32>,
    /// What the calibration text is called in the profile.
    pub calibration: String,
    /// A folder for the activation codes while they are recorded (a byte per token, layer and
    /// neuron, in unnamed temporary files the system removes); `None`: memory.
    pub spill_dir: Option<std::path::PathBuf>,
}

impl Default for ProfileOptions {
    fn default() -> Self {
        Self {
            chunk: 512,
            sparsity: None,
            calibration: "built-in".into(),
            spill_dir: None,
        }
    }
}

/// The dense model (`engine`) over `tokens` in chunks: every FFN layer's activations recorded
/// into a profile of `model` (at `path`) and its trace. Dense models only (mixtures of experts
/// are counted by [`crate::moe::count_experts`]).
pub fn profile(
    model: &Model,
    path: &Path,
    engine: &mut Engine<'_>,
    tokens: &[TokenId],
    opts: &ProfileOptions,
    progress: Progress<'_>,
) -> Result<(Profile, Trace), ConvertError> {
    let c = &model.config;
    if let Some(s) = opts.sparsity.filter(|s| !(0.0..1.0).contains(s)) {
        return Err(ConvertError::Refused(format!(
            "sparsity {s} is outside 0..1"
        )));
    }
    if tokens.is_empty() || opts.chunk == 0 {
        return Err(ConvertError::Refused("nothing to profile".into()));
    }
    let chunk = opts.chunk.min(engine.n_ctx());
    let mut profiler = Profiler::new(c.n_layer, c.n_ff, pi2_engine::profile_activation(c.ffn_act));
    if let Some(dir) = &opts.spill_dir {
        profiler = profiler.spill_to(dir)?;
    }
    let bos = model
        .tokenizer
        .add_bos
        .then_some(model.tokenizer.bos)
        .flatten();
    let mut done = 0;
    for part in tokens.chunks(chunk) {
        engine.truncate(0);
        // A BOS opens each chunk where the model expects one; it is not profiled as text.
        if let Some(b) = bos {
            engine.forward(&[b], Logits::Last)?;
        }
        engine.forward_observed(part, Logits::Last, Some(&mut profiler))?;
        done += part.len();
        progress("profile", done, tokens.len());
    }
    engine.truncate(0);
    let cal = Calibration {
        file: opts.calibration.clone(),
        tokens: tokens.len(),
    };
    let cfg = ProfileConfig {
        reference_sparsity: opts.sparsity.unwrap_or(0.5),
        nonzero: opts.sparsity.is_none() && c.ffn_act.exact_sparsity(),
    };
    progress("summarise", 0, 1);
    Ok(profiler.finish(model_info(model, path), cal, &cfg)?)
}

/// How the per-layer thresholds are chosen.
#[derive(Clone, Debug)]
pub enum Sparsity {
    /// One level for every layer (0..0.95).
    Uniform(f32),
    /// Per layer by measured sensitivity, for the fewest bytes within `max_increase` of the
    /// dense perplexity on held-out calibration tokens (0.03: +3%), sensitivity measured on
    /// `sensitivity_tokens` tokens.
    Auto {
        max_increase: f64,
        sensitivity_tokens: usize,
    },
}

/// Mixture-of-experts models: every expert's neurons counted over `tokens` (per unit: tokens
/// routed, and per neuron the tokens on which it fired; [`crate::moe::count_experts`]).
/// Co-activation, traces and cache curves are per dense layer and are not made for experts.
/// Only exact activity is counted: a ReLU-family FFN and no `opts.sparsity`.
pub fn profile_experts(
    model: &Model,
    engine: &mut Engine<'_>,
    tokens: &[TokenId],
    opts: &ProfileOptions,
    progress: Progress<'_>,
) -> Result<crate::moe::ExpertCounts, ConvertError> {
    let c = &model.config;
    if opts.sparsity.is_some() || !c.ffn_act.exact_sparsity() {
        return Err(ConvertError::Refused(
            "profiling a mixture-of-experts model counts exact activity only: it needs a \
             ReLU-family FFN and no --sparsity"
                .into(),
        ));
    }
    let thresholds = vec![0.0; c.n_layer];
    let n = tokens.len();
    let chunk = opts.chunk.min(engine.n_ctx());
    let counts = crate::moe::count_experts(engine, tokens, chunk, &thresholds, |d| {
        progress("experts", d, n)
    })?;
    Ok(counts)
}

/// How to convert.
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    /// Tokens per calibration chunk (each from an empty cache).
    pub chunk: usize,
    pub sparsity: Sparsity,
    /// `None`: lowrank for ReLU-family FFNs, none (every neuron a candidate) for the others.
    pub predictor: Option<Option<PredictorKind>>,
    pub fit: FitConfig,
    /// The layout and head: `sparsity`, `predictor` and `fit` are filled in here.
    pub layout: ConvertConfig,
    /// Mixtures of experts: every layer's confirm threshold (`None`: 0 for ReLU-family FFNs).
    pub expert_threshold: Option<f32>,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        Self {
            chunk: 512,
            sparsity: Sparsity::Auto {
                max_increase: 0.015,
                sensitivity_tokens: 256,
            },
            predictor: None,
            fit: FitConfig::default(),
            layout: ConvertConfig::default(),
            expert_threshold: None,
        }
    }
}

impl ConvertOptions {
    /// Refuses options no conversion can use, naming the option (as `pi2 convert` spells it).
    pub fn check(&self) -> Result<(), ConvertError> {
        let refuse = |msg: String| Err(ConvertError::Refused(msg));
        match self.sparsity {
            Sparsity::Uniform(s) if !(0.0..=0.95).contains(&s) => {
                return refuse(format!("--sparsity {s} is outside 0..0.95"))
            }
            Sparsity::Auto {
                max_increase: m, ..
            } if !(m > 0.0 && m <= 1.0) => {
                let pct = 100.0 * m;
                return refuse(format!(
                    "--max-ppl-increase {pct} is outside 0..100 (percent)"
                ));
            }
            Sparsity::Auto {
                sensitivity_tokens: n,
                ..
            } if !(16..=1 << 16).contains(&n) => {
                return refuse(format!("--sensitivity-tokens {n} is outside 16..65536"));
            }
            _ => {}
        }
        if let Some(h) = &self.layout.head {
            if !(h.share > 0.0 && h.share <= 1.0) {
                return refuse(format!("--head-share {} is outside (0, 1]", h.share));
            }
            if h.cluster == 0 || !h.cluster.is_multiple_of(8) || h.cluster > 1 << 16 {
                let c = h.cluster;
                return refuse(format!(
                    "--head-cluster {c} is not a multiple of 8 in 8..65536"
                ));
            }
        }
        if !(0.5..=1.0).contains(&self.fit.target_recall) {
            let r = self.fit.target_recall;
            return refuse(format!("--recall {r} is outside 0.5..1"));
        }
        Ok(())
    }
}

/// What [`convert_file`] made.
#[derive(Debug)]
pub struct Converted {
    /// Per layer and the head (dense models).
    pub report: Option<ConvertReport>,
    /// The sensitivity table and held-out check (`Sparsity::Auto`).
    pub choice: Option<QualityChoice>,
    /// Mean sparsity of the layers.
    pub sparsity: f32,
    /// Mixtures of experts: what calibration counted.
    pub experts: Option<crate::moe::ExpertCounts>,
    /// Bytes of the written file.
    pub bytes: u64,
}

/// Converts `model` (read from `input`) into `output` on calibration `tokens` (the last
/// [`ConvertConfig::held_out`] share held out), running the dense model as `engine_cfg` says;
/// a dense model needs its `profile`. The file is verified before it gets its name; nothing
/// is written over an existing file unless `force`, nor ever over `input`.
#[allow(clippy::too_many_arguments)]
pub fn convert_file(
    model: &Model,
    input: &Path,
    profile: Option<&Profile>,
    tokens: &[TokenId],
    engine_cfg: &EngineConfig,
    opts: &ConvertOptions,
    output: &Path,
    force: bool,
    progress: Progress<'_>,
) -> Result<Converted, ConvertError> {
    opts.check()?;
    crate::check_types(&opts.layout, model.config.n_embd)?;
    if tokens.len() < 64 {
        return Err(ConvertError::Refused(format!(
            "calibration needs at least 64 tokens ({} given)",
            tokens.len()
        )));
    }
    crate::check_mixture_layers(model)?;
    let mut engine = Engine::new(model, engine_cfg)?;
    if model.config.n_expert > 0 {
        return convert_experts(
            model,
            input,
            &mut engine,
            tokens,
            opts,
            output,
            force,
            progress,
        );
    }
    let profile = profile.ok_or_else(|| {
        ConvertError::Refused("a dense model converts with its profile (`pi2 profile`)".into())
    })?;
    profile
        .model
        .check_compatible(&model_info(model, input))
        .map_err(ConvertError::Fit)?;
    let (thresholds, sparsity, choice) = match &opts.sparsity {
        Sparsity::Uniform(s) => (uniform_thresholds(profile, *s)?, *s, None),
        Sparsity::Auto {
            max_increase,
            sensitivity_tokens,
        } => {
            let c = auto_thresholds(
                model,
                profile,
                &mut engine,
                tokens,
                opts,
                *max_increase,
                *sensitivity_tokens,
                progress,
            )?;
            let mean = c.sparsity.iter().sum::<f32>() / c.sparsity.len().max(1) as f32;
            (c.thresholds.clone(), mean, Some(c))
        }
    };
    let predictor = predictor_for(model, opts);
    // Inputs are kept only to fit predictors on.
    let keep_inputs = predictor.is_some();
    let samples = crate::collect_samples(
        &mut engine,
        tokens,
        opts.chunk,
        &thresholds,
        keep_inputs,
        |d| progress("calibrate", d, tokens.len()),
    )?;
    drop(engine);
    let cfg = ConvertConfig {
        sparsity,
        predictor,
        fit: opts.fit.clone(),
        ..opts.layout.clone()
    };
    progress("fit", 0, 1);
    let (writer, report) = crate::convert(model, profile, &thresholds, samples, &cfg)?;
    progress("write", 0, 1);
    crate::write_verified(&writer, model, output, input, force)?;
    drop(writer);
    Ok(Converted {
        report: Some(report),
        choice,
        sparsity,
        experts: None,
        bytes: file_bytes(output)?,
    })
}

/// The predictor a conversion of `model` under `opts` fits: the one asked for, else lowrank for
/// ReLU-family FFNs and none for the others.
fn predictor_for(model: &Model, opts: &ConvertOptions) -> Option<PredictorKind> {
    opts.predictor.unwrap_or_else(|| {
        model
            .config
            .ffn_act
            .exact_sparsity()
            .then_some(PredictorKind::Lowrank)
    })
}

/// What [`convert_file`] would write for the dense `model` under `opts`, known before it runs
/// ([`crate::plan::planned`]); predictors are counted at the smallest rank the fit may choose,
/// so a floor computed from it is a lower bound (exact without predictors).
pub fn planned(
    model: &Model,
    opts: &ConvertOptions,
) -> Result<pi2_engine::PlannedConversion, ConvertError> {
    let cfg = ConvertConfig {
        predictor: predictor_for(model, opts),
        fit: opts.fit.clone(),
        ..opts.layout.clone()
    };
    crate::plan::planned(model, &cfg, opts.fit.rank_step)
}

fn file_bytes(path: &Path) -> Result<u64, ConvertError> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|source| ConvertError::Io {
            path: path.display().to_string(),
            source,
        })
}

/// Every layer's threshold for one sparsity level.
pub fn uniform_thresholds(profile: &Profile, sparsity: f32) -> Result<Vec<f32>, ConvertError> {
    if !(0.0..=0.95).contains(&sparsity) {
        return Err(ConvertError::Refused(format!(
            "sparsity {sparsity} is outside 0..0.95"
        )));
    }
    Ok(profile
        .layers
        .iter()
        .map(|l| l.threshold_for(sparsity))
        .collect::<Result<_, _>>()?)
}

/// Per-layer thresholds from measured sensitivity within `max_increase` on the held-out
/// calibration tokens.
#[allow(clippy::too_many_arguments)]
fn auto_thresholds(
    model: &Model,
    profile: &Profile,
    engine: &mut Engine<'_>,
    tokens: &[TokenId],
    opts: &ConvertOptions,
    max_increase: f64,
    sensitivity_tokens: usize,
    progress: Progress<'_>,
) -> Result<QualityChoice, ConvertError> {
    if !(max_increase > 0.0 && max_increase <= 1.0) {
        return Err(ConvertError::Refused(format!(
            "a perplexity increase of {:.1}% is outside 0..100%",
            100.0 * max_increase
        )));
    }
    if !(16..=1 << 16).contains(&sensitivity_tokens) {
        return Err(ConvertError::Refused(format!(
            "{sensitivity_tokens} sensitivity tokens is outside 16..65536"
        )));
    }
    let held_share = opts.layout.held_out;
    let held = tokens.len() - (tokens.len() as f32 * (1.0 - held_share)) as usize;
    let tuning = &tokens[..sensitivity_tokens.min(tokens.len() - held)];
    let held_out = &tokens[tokens.len() - held..];
    let bytes: Vec<f64> = model
        .weights
        .layers
        .iter()
        .map(|l| (l.up.bytes(&model.file) + l.down.bytes(&model.file)) as f64)
        .collect();
    let quality = QualityTarget {
        max_increase,
        chunk: opts.chunk,
        ..Default::default()
    };
    choose_sparsity(
        engine,
        profile,
        tuning,
        held_out,
        &bytes,
        &quality,
        |w, d, t| progress(w, d, t),
    )
}

/// A mixture of experts: every expert's neurons counted on the calibration tokens, each expert
/// written hot-first (streamed), verified.
#[allow(clippy::too_many_arguments)]
fn convert_experts(
    model: &Model,
    input: &Path,
    engine: &mut Engine<'_>,
    tokens: &[TokenId],
    opts: &ConvertOptions,
    output: &Path,
    force: bool,
    progress: Progress<'_>,
) -> Result<Converted, ConvertError> {
    let c = &model.config;
    if opts.predictor.is_some_and(|p| p.is_some()) {
        return Err(ConvertError::Refused(
            "mixture-of-experts models convert without predictors (--predictor none): the router \
             picks the experts and a ReLU-family FFN's activity is exact"
                .into(),
        ));
    }
    let threshold = match opts.expert_threshold {
        Some(t) if t.is_finite() && t >= 0.0 => t,
        Some(t) => return Err(ConvertError::Refused(format!("threshold {t} must be >= 0"))),
        None if c.ffn_act.exact_sparsity() => 0.0,
        None => {
            return Err(ConvertError::Refused(format!(
                "this mixture-of-experts model has a {} FFN, whose activity is not exact: give a \
                 threshold (--threshold)",
                c.ffn_act.name()
            )))
        }
    };
    let th = vec![threshold; c.n_layer];
    let counts = crate::moe::count_experts(engine, tokens, opts.chunk, &th, |d| {
        progress("calibrate", d, tokens.len())
    })?;
    let cfg = ConvertConfig {
        sparsity: 0.0,
        predictor: None,
        ..opts.layout.clone()
    };
    crate::moe::convert(model, &counts, &th, &cfg, output, input, force, |i, n| {
        progress("write", i, n)
    })?;
    Ok(Converted {
        report: None,
        choice: None,
        sparsity: 0.0,
        experts: Some(counts),
        bytes: file_bytes(output)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_no_conversion_can_use_are_refused_by_name() {
        assert!(ConvertOptions::default().check().is_ok());
        let with = |f: &dyn Fn(&mut ConvertOptions)| {
            let mut o = ConvertOptions::default();
            f(&mut o);
            o.check().unwrap_err().to_string()
        };
        assert!(with(&|o| o.sparsity = Sparsity::Uniform(0.99)).contains("--sparsity"));
        assert!(with(&|o| o.sparsity = Sparsity::Auto {
            max_increase: 0.0,
            sensitivity_tokens: 256
        })
        .contains("--max-ppl-increase"));
        assert!(with(&|o| o.sparsity = Sparsity::Auto {
            max_increase: 0.03,
            sensitivity_tokens: 8
        })
        .contains("--sensitivity-tokens"));
        assert!(with(&|o| o.fit.target_recall = 0.2).contains("--recall"));
        let mut bad_head = crate::head::HeadConfig {
            share: 1.5,
            ..Default::default()
        };
        assert!(with(&|o| o.layout.head = Some(bad_head)).contains("--head-share"));
        bad_head.share = 0.25;
        bad_head.cluster = 12;
        assert!(with(&|o| o.layout.head = Some(bad_head)).contains("--head-cluster"));
    }
}
