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
mod codes;
mod hitrate;
mod placement;
#[cfg(feature = "plots")]
pub mod plots;
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
    #[error("cannot draw the picture: {0}")]
    Picture(String),
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
    let t = &*CODES;
    // Also NaN: code 0.
    if score.partial_cmp(&t.edges[1]).is_none_or(|o| o.is_lt()) {
        return 0;
    }
    if score >= t.edges[255] {
        return 255;
    }
    // A normal float from here: 16 codes per power of two, the mantissa's top bits give the
    // code within one, and one comparison settles it against the exact edges. (The profile
    // codes every neuron of every token: a logarithm each was a tenth of its time.)
    let bits = score.to_bits();
    let exponent = ((bits >> 23) & 0xff) as i32 - 127;
    let within = t.within[((bits >> 15) & 0xff) as usize] as i32;
    let c = (128 + 16 * exponent + within).clamp(1, 255) as usize;
    if c < 255 && score >= t.edges[c + 1] {
        c as u8 + 1
    } else if c > 1 && score < t.edges[c] {
        c as u8 - 1
    } else {
        c as u8
    }
}

/// The lower edge of score code `c` (0 for code 0).
pub fn code_edge(c: u8) -> f32 {
    CODES.edges[c as usize]
}

struct CodeTables {
    /// `edges[c]`: the lower edge of code `c`.
    edges: [f32; 256],
    /// Per top 8 mantissa bits: the code offset within a power of two at the bin's start.
    within: [u8; 256],
}

static CODES: std::sync::LazyLock<CodeTables> = std::sync::LazyLock::new(|| CodeTables {
    edges: std::array::from_fn(|c| match c {
        0 => 0.0,
        _ => ((c as f32 - 128.0) / 16.0).exp2(),
    }),
    within: std::array::from_fn(|j| ((1.0 + j as f64 / 256.0).log2() * 16.0).floor() as u8),
});

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
        assert_eq!(score_code(f32::INFINITY), 255);
        assert_eq!(score_code(-1.0), 0);
    }

    /// The definition: the largest code whose edge is at most the score.
    fn code_by_search(score: f32) -> u8 {
        (1..=255u8)
            .rev()
            .find(|&c| score >= code_edge(c))
            .unwrap_or(0)
    }

    #[test]
    fn codes_follow_their_definition_everywhere() {
        // Every float from below code 1 to above code 255, at a stride that visits every
        // mantissa bin of every power of two.
        let (lo, hi) = (1e-3f32.to_bits(), 1e3f32.to_bits());
        for bits in (lo..hi).step_by(997) {
            let s = f32::from_bits(bits);
            assert_eq!(score_code(s), code_by_search(s), "{s:e}");
        }
        for c in 1..=255u8 {
            let e = code_edge(c);
            for s in [
                e,
                f32::from_bits(e.to_bits() - 1),
                f32::from_bits(e.to_bits() + 1),
            ] {
                assert_eq!(score_code(s), code_by_search(s), "{s:e} near edge {c}");
            }
        }
    }
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
