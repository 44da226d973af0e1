//! pi2-sparse: activation sparsity of FFN neurons.
//!
//! Decoding one token uses only some FFN neurons (a neuron = one gate row, one up row and one
//! down column). This crate measures which, and how predictably:
//!
//! - [`FfnObserver`]: the hook an engine calls with each FFN layer's input and gate
//!   pre-activations (pi2's engine does; any engine can).
//! - [`Profiler`] records, per layer, every (token, neuron) activation score on a log scale
//!   (one byte each), and [`Profiler::finish`] turns it into a [`Profile`]: thresholds for any
//!   target sparsity, per-neuron frequency and magnitude, co-activation, and the hit rate a
//!   neuron cache of each size would get (pinned hot set + LRU), plus the activation [`Trace`]
//!   that cache policies can be replayed on.
//!
//! "Active" follows CATS for SiLU/GELU models: a neuron is active when `|act(gate . x)|` reaches a
//! per-layer threshold calibrated for a target sparsity; for ReLU models any threshold > 0 is
//! exact.

mod coact;
mod hitrate;
mod placement;
mod predictor;
mod profile;
mod sensitivity;
mod trace;

pub use hitrate::{hit_rates, HitPoint};
pub use placement::{pages_touched, placement, FiringColumns, PLACEMENT_BAND};
pub use predictor::{lowrank, train, Fit, FitConfig, LayerSamples, Predictor, PredictorKind};
pub use profile::{
    Activation, Calibration, Coactivation, LayerProfile, ModelInfo, Profile, ProfileConfig,
    Profiler, PROFILE_FORMAT, PROFILE_VERSION, SPARSITY_LEVELS,
};
pub use sensitivity::{Sensitivity, SPARSITY_STEP};
pub use trace::{Trace, TRACE_MAGIC, TRACE_VERSION};

/// Sparsity errors: files that are not what they claim, and requests outside their range.
#[derive(Debug, thiserror::Error)]
pub enum SparseError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a pi2 profile ({msg})")]
    BadProfile { path: String, msg: String },
    #[error("{path}: not a pi2 activation trace ({msg})")]
    BadTrace { path: String, msg: String },
    #[error("the profile is for {want}, but the model is {got}")]
    ModelMismatch { want: String, got: String },
    #[error("sparsity {0} is outside 0..1")]
    BadSparsity(f32),
    #[error("no tokens were profiled")]
    Empty,
    #[error("cannot fit a predictor: {0}")]
    Predictor(String),
    #[error("layer sensitivity: {0}; convert the model again")]
    BadSensitivity(String),
}

/// What an engine reports for each FFN layer it computes densely.
pub trait FfnObserver {
    /// Layer `layer` over `n` tokens: `x` is its normalized input (`n * n_embd`), `gate` the gate
    /// pre-activations (`n * n_ff`), both row-major by token.
    fn observe(&mut self, layer: usize, x: &[f32], gate: &[f32]);

    /// The residual stream entering layer `layer` (`n * n_embd`, row-major by token), what
    /// a pass resumed at that layer starts from. Ignored unless needed.
    fn observe_stream(&mut self, _layer: usize, _x: &[f32]) {}

    /// Expert `expert` of mixture-of-experts layer `layer` over the tokens routed to it: `x`
    /// their normalized inputs (`m * n_embd`), `gate` the expert's gate pre-activations
    /// (`m * n_ff`). Ignored unless an observer needs experts.
    fn observe_expert(&mut self, _layer: usize, _expert: usize, _x: &[f32], _gate: &[f32]) {}

    /// The final normalized hidden states of every token of the batch (`n * n_embd`), what
    /// the output matrix multiplies (the sparse head's calibration). Ignored unless needed.
    fn observe_head(&mut self, _h: &[f32]) {}

    /// A confirm threshold for dense layer `layer`: when `Some(t)`, the engine drops every
    /// neuron whose `|act(gate . x)|` is below `t` (as sparse decode drops unconfirmed ones)
    /// while keeping the dense weights and kernels, so the effect of threshold sparsity alone
    /// is measured (sensitivity, quality checks). Called after [`FfnObserver::observe`];
    /// mixture-of-experts layers ignore it.
    fn confirm_threshold(&self, _layer: usize) -> Option<f32> {
        None
    }
}

/// Activation scores on a log scale in one byte: code `c >= 1` covers `[2^((c-128)/16),
/// 2^((c-127)/16))`, so a threshold at a code edge is exact (`score >= edge(c)` iff
/// `code(score) >= c`) and the resolution is 4.4%. Code 0 holds everything below 2^-8.
pub fn score_code(score: f32) -> u8 {
    // Also NaN: code 0.
    if score.partial_cmp(&code_edge(1)).is_none_or(|o| o.is_lt()) {
        return 0;
    }
    let c = (score.log2() * 16.0 + 128.0).floor().clamp(1.0, 255.0) as u8;
    // Settle float rounding at the edges so `code_edge` is the exact boundary.
    if c < 255 && score >= code_edge(c + 1) {
        c + 1
    } else if c > 1 && score < code_edge(c) {
        c - 1
    } else {
        c
    }
}

/// The lower edge of score code `c` (0 for code 0).
pub fn code_edge(c: u8) -> f32 {
    if c == 0 {
        0.0
    } else {
        ((c as f32 - 128.0) / 16.0).exp2()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_monotone_and_edges_exact() {
        let mut last = 0;
        for i in 0..20_000 {
            let s = i as f32 * 1e-3;
            let c = score_code(s);
            assert!(c >= last);
            last = c;
        }
        for c in 1..=255u8 {
            let e = code_edge(c);
            assert_eq!(score_code(e), c, "edge of {c}");
            assert!(score_code(e * (1.0 - 1e-6)) < c);
        }
        assert_eq!(score_code(f32::NAN), 0);
        assert_eq!(score_code(0.0), 0);
        assert_eq!(score_code(1e30), 255);
    }
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
