//! RoPE's hyper-parameters from a file's keys: rotated dimensions, base, linear scaling and
//! YaRN.

use super::{get_f32_or, get_usize_or};
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, Value};

/// YaRN (llama.cpp's `rope_yarn`): per rotated pair, a ramp between interpolated (scaled) and
/// extrapolated (plain) frequencies over the pairs between the correction dimensions (its
/// factor of the rotated Q and K is `ModelConfig::rope_mscale`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// The context the model was trained on before extension.
    pub orig_ctx: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
}

impl Yarn {
    /// The first and last rotated pair the ramp runs over (ggml's `rope_yarn_corr_dims`).
    pub fn corr_dims(&self, n_rot: usize, base: f32) -> (f32, f32) {
        let dim = |beta: f32| {
            n_rot as f32 * (self.orig_ctx as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let start = dim(self.beta_fast).floor().max(0.0);
        let end = dim(self.beta_slow).ceil().min(n_rot as f32 - 1.0);
        (start, end)
    }

    /// The share of pair `i`'s frequency that stays unscaled (1 below the ramp, 0 above).
    pub fn extrapolation(&self, i: usize, (low, high): (f32, f32)) -> f32 {
        let y = (i as f32 - low) / (high - low).max(0.001);
        1.0 - y.clamp(0.0, 1.0)
    }
}

/// RoPE as a file describes it (`a`: the key prefix).
pub(super) struct Rope {
    pub n_rot: usize,
    pub base: f32,
    pub freq_scale: f32,
    pub yarn: Option<Yarn>,
    /// Factor of the rotated dimensions of Q and K (ggml's `attn_factor`, YaRN's included).
    pub mscale: f32,
    /// The context before any extension (`rope.scaling.original_context_length`).
    pub n_ctx_orig: usize,
}

/// RoPE's rotated dimensions, base, frequency scale, YaRN and factor (`a`: the key prefix).
pub(super) fn rope(f: &GgufFile, a: &str, head_dim: usize, n_ctx_train: usize) -> Result<Rope> {
    let k = |s: &str| format!("{a}.{s}");
    let n_rot = get_usize_or(f, &k("rope.dimension_count"), head_dim)?;
    if n_rot > head_dim || n_rot % 2 != 0 {
        return Err(ModelError::Corrupt(format!(
            "rope.dimension_count {n_rot} is invalid for head size {head_dim}"
        )));
    }
    let rope_base = get_f32_or(f, &k("rope.freq_base"), 10000.0)?;
    let mut freq_scale = get_f32_or(f, &k("rope.scale_linear"), 1.0)?.recip();
    let mut yarn = None;
    let attn_factor = get_f32_or(f, &k("rope.scaling.attn_factor"), 1.0)?;
    if !(attn_factor.is_finite() && attn_factor > 0.0) {
        return Err(ModelError::Corrupt(format!(
            "{a}.rope.scaling.attn_factor = {attn_factor} is not a positive number"
        )));
    }
    let mut mscale = attn_factor;
    let n_ctx_orig = get_usize_or(f, &k("rope.scaling.original_context_length"), n_ctx_train)?;
    match f.get(&k("rope.scaling.type")).and_then(Value::as_str) {
        None | Some("none") => {}
        Some("linear") => freq_scale = get_f32_or(f, &k("rope.scaling.factor"), 1.0)?.recip(),
        Some("yarn") => {
            let factor = get_f32_or(f, &k("rope.scaling.factor"), 1.0)?;
            if !(factor.is_finite() && factor > 0.0) {
                return Err(ModelError::Corrupt(format!(
                    "{a}.rope.scaling.factor = {factor} is not a positive number"
                )));
            }
            let log_mul = get_f32_or(f, &k("rope.scaling.yarn_log_multiplier"), 0.0)?;
            if !log_mul.is_finite() {
                return Err(ModelError::Corrupt(format!(
                    "{a}.rope.scaling.yarn_log_multiplier = {log_mul} is not a number"
                )));
            }
            freq_scale = factor.recip();
            // llama.cpp cancels ggml's own factor where YaRN scales Q and K itself, so the
            // factor is `m(1) / m(log_mul)` with `m(x) = 1 + 0.1 x ln(factor)` (1 for a
            // factor up to 1; without a log multiplier `m(0)` is 1), times `attn_factor`.
            let m = |x: f32| match factor <= 1.0 {
                true => 1.0,
                false => 1.0 + 0.1 * x * factor.ln(),
            };
            mscale = attn_factor * m(1.0) / m(log_mul);
            yarn = Some(Yarn {
                orig_ctx: n_ctx_orig.max(1),
                beta_fast: get_f32_or(f, &k("rope.scaling.yarn_beta_fast"), 32.0)?,
                beta_slow: get_f32_or(f, &k("rope.scaling.yarn_beta_slow"), 1.0)?,
            });
        }
        Some(other) => {
            return Err(ModelError::Unsupported(format!(
                "RoPE scaling type `{other}`"
            )))
        }
    }
    Ok(Rope {
        n_rot,
        base: rope_base,
        freq_scale,
        yarn,
        mscale,
        n_ctx_orig: n_ctx_orig.max(1),
    })
}
