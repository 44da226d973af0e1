//! The sparse FFN from the options: a converted model's own (thresholds possibly re-chosen), or
//! one built at load from a plain model and a threshold or profile.

use crate::error::{Result, RuntimeError};
use crate::options::{parse_type, SparseOptions};
use pi2_engine::SparseFfn;
use pi2_model::Model;
use pi2_sparse::Profile;
use std::path::Path;

/// What a profile must match: the model's shape and file (the description profiles record).
pub use pi2_convert::pipeline::model_info;

/// Checks a sparsity target.
pub fn check_sparsity(s: f32) -> Result<f32> {
    if !(0.0..=0.95).contains(&s) {
        return Err(RuntimeError::option(
            "--sparsity",
            format!("{s} is outside 0..0.95"),
        ));
    }
    Ok(s)
}

/// Per-layer thresholds for `sparsity` from a profile.
pub fn thresholds(p: &Profile, sparsity: f32) -> Result<Vec<f32>> {
    check_sparsity(sparsity)?;
    Ok(p.layers
        .iter()
        .map(|l| l.threshold_for(sparsity))
        .collect::<Result<_, _>>()?)
}

fn load_profile(path: &Path, model: &Model, model_path: &Path) -> Result<Profile> {
    let p = Profile::load(path)?;
    p.model
        .check_compatible(&model_info(model, model_path))
        .map_err(|e| RuntimeError::option("--profile", format!("{}: {e}", path.display())))?;
    Ok(p)
}

/// The sparse FFN `o` asks for (`None`: dense). `batches` makes batches sparse too
/// (perplexity measures the sparse model; prefill otherwise stays dense).
pub fn build<'m>(
    o: &SparseOptions,
    model: &'m Model,
    model_path: &Path,
    batches: bool,
) -> Result<Option<SparseFfn<'m>>> {
    if o.dense {
        return Ok(None);
    }
    let converted = pi2_engine::load_sparse(model)?;
    if converted.is_none() && !o.wanted() {
        return Ok(None);
    }
    let n_layer = model.config.n_layer;
    let chosen: Option<Vec<f32>> = match (o.threshold, o.sparsity) {
        (Some(t), _) => {
            if !(t.is_finite() && t >= 0.0) {
                return Err(RuntimeError::option(
                    "--threshold",
                    format!("{t} must be a number >= 0"),
                ));
            }
            Some(vec![t; n_layer])
        }
        (None, Some(s)) => {
            let profile = match (&o.profile, &converted) {
                (Some(p), _) => load_profile(p, model, model_path)?,
                (None, Some((_, Some(p)))) => p.clone(),
                _ => {
                    return Err(RuntimeError::option(
                        "--sparsity",
                        "needs per-layer thresholds: pass --profile (from `pi2 profile`) or use a model made by `pi2 convert`",
                    ))
                }
            };
            Some(thresholds(&profile, s)?)
        }
        (None, None) => None,
    };
    let mut sp = match converted {
        Some((sp, _)) => sp,
        None => {
            // ReLU-family FFNs are exactly sparse at threshold 0: nothing to choose.
            let exact = model
                .config
                .ffn_act
                .exact_sparsity()
                .then(|| vec![0.0; n_layer]);
            let Some(t) = chosen.as_ref().or(exact.as_ref()) else {
                return Err(RuntimeError::option(
                    "--sparse",
                    "a model that was not converted needs --sparsity with --profile, or --threshold",
                ));
            };
            let down = o
                .down_type
                .as_deref()
                .map(|t| parse_type("--down-type", t))
                .transpose()?;
            SparseFfn::from_dense(model, t, down)?
        }
    };
    if let Some(t) = &chosen {
        sp.set_thresholds(t)?;
    }
    sp.use_predictor = sp.has_predictors() && !o.no_predictor;
    sp.batches_too = batches;
    Ok(Some(sp))
}
