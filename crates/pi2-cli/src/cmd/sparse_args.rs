//! The sparse-FFN options shared by `run`, `perplexity` and `bench`, and building the engine's
//! sparse weights from them.

use anyhow::{bail, Context, Result};
use clap::Args;
use pi2_kernels::QuantType;
use pi2_model::Model;
use pi2_sched::SparseFfn;
use pi2_sparse::Profile;
use std::path::{Path, PathBuf};

#[derive(Args, Clone, Debug, Default)]
pub struct SparseArgs {
    /// Compute the FFN sparsely in decode (automatic for a model made by `pi2 convert`)
    #[arg(long)]
    pub sparse: bool,
    /// Compute the FFN densely, even for a converted model
    #[arg(long, conflicts_with = "sparse")]
    pub dense: bool,
    /// Target FFN sparsity in 0..0.95 (fraction of neurons skipped): per-layer thresholds from
    /// the converted model's profile or from --profile
    #[arg(long)]
    pub sparsity: Option<f32>,
    /// One threshold for every layer: a neuron fires when |silu(gate . x)| >= T
    #[arg(long, conflicts_with = "sparsity")]
    pub threshold: Option<f32>,
    /// Activation profile from `pi2 profile` (needed for --sparsity on an unconverted model)
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Skip the predictor: every neuron is a candidate (gate rows all computed)
    #[arg(long)]
    pub no_predictor: bool,
    /// Type of the transposed down rows built at load for an unconverted model
    /// (q8_0, q4_1, q4_0, f16, f32; default: the model's down type)
    #[arg(long)]
    pub down_type: Option<String>,
}

impl SparseArgs {
    /// Whether any option asks for sparsity.
    pub fn wanted(&self) -> bool {
        self.sparse || self.sparsity.is_some() || self.threshold.is_some()
    }
}

pub fn parse_type(name: &str) -> Result<QuantType> {
    QuantType::ALL
        .into_iter()
        .find(|t| t.to_string().eq_ignore_ascii_case(name))
        .with_context(|| format!("unknown tensor type `{name}`"))
}

pub fn check_sparsity(s: f32) -> Result<f32> {
    if !(0.0..=0.95).contains(&s) {
        bail!("--sparsity {s} is outside 0..0.95");
    }
    Ok(s)
}

fn load_profile(path: &Path, model: &Model, model_path: &Path) -> Result<Profile> {
    let p = Profile::load(path)?;
    p.model
        .check_compatible(&super::profile::model_info(model, model_path))
        .with_context(|| format!("profile {}", path.display()))?;
    Ok(p)
}

/// Per-layer thresholds for `sparsity` from a profile.
pub fn thresholds(p: &Profile, sparsity: f32) -> Result<Vec<f32>> {
    check_sparsity(sparsity)?;
    Ok(p.layers
        .iter()
        .map(|l| l.threshold_for(sparsity))
        .collect::<Result<_, _>>()?)
}

/// The sparse FFN the options ask for (`None`: dense). `batches` makes batches sparse too
/// (perplexity measures the sparse model; prefill otherwise stays dense).
pub fn build<'m>(
    a: &SparseArgs,
    model: &'m Model,
    model_path: &Path,
    batches: bool,
) -> Result<Option<SparseFfn<'m>>> {
    if a.dense {
        return Ok(None);
    }
    let converted = pi2_sched::convert::load_sparse(model)?;
    if converted.is_none() && !a.wanted() {
        return Ok(None);
    }
    let n_layer = model.config.n_layer;
    let chosen: Option<Vec<f32>> = match (a.threshold, a.sparsity) {
        (Some(t), _) => {
            if !(t.is_finite() && t >= 0.0) {
                bail!("--threshold {t} must be a number >= 0");
            }
            Some(vec![t; n_layer])
        }
        (None, Some(s)) => {
            let profile = match (&a.profile, &converted) {
                (Some(p), _) => load_profile(p, model, model_path)?,
                (None, Some((_, Some(p)))) => p.clone(),
                _ => bail!(
                    "--sparsity needs per-layer thresholds: pass --profile (from `pi2 profile`) \
                     or use a model made by `pi2 convert`"
                ),
            };
            Some(thresholds(&profile, s)?)
        }
        (None, None) => None,
    };
    let mut sp = match converted {
        Some((sp, _)) => sp,
        None => {
            let Some(t) = &chosen else {
                bail!("--sparse on a model that was not converted needs --sparsity with --profile, or --threshold");
            };
            let down = a.down_type.as_deref().map(parse_type).transpose()?;
            SparseFfn::from_dense(model, t, down)?
        }
    };
    if let Some(t) = &chosen {
        sp.set_thresholds(t)?;
    }
    sp.use_predictor = sp.has_predictors() && !a.no_predictor;
    sp.batches_too = batches;
    Ok(Some(sp))
}

/// The measured fractions on stderr: candidates, confirmed, FFN bytes, recall per layer.
pub fn print_stats(st: &pi2_sched::SparseStats) {
    eprintln!(
        "sparse: candidates {:.3}, confirmed {:.3} (FFN sparsity {:.3}), FFN bytes {:.3} of dense",
        st.candidate_fraction(),
        st.confirmed_fraction(),
        1.0 - st.confirmed_fraction(),
        st.byte_fraction()
    );
    if let Some(r) = st.total_recall() {
        let per: Vec<String> = st
            .recall()
            .iter()
            .map(|r| r.map_or("-".into(), |r| format!("{r:.3}")))
            .collect();
        eprintln!(
            "sparse: predictor recall {r:.4}; per layer {}",
            per.join(" ")
        );
    }
}

/// The measured fractions as JSON.
pub fn stats_json(st: &pi2_sched::SparseStats) -> serde_json::Value {
    serde_json::json!({
        "candidates": st.candidate_fraction(),
        "confirmed": st.confirmed_fraction(),
        "ffn_sparsity": 1.0 - st.confirmed_fraction(),
        "ffn_bytes_per_token": st.ffn_bytes as f64 / (st.token_layers.max(1) as f64 / st.layer_tokens.len().max(1) as f64),
        "ffn_bytes_fraction": st.byte_fraction(),
        "recall": st.total_recall(),
    })
}
