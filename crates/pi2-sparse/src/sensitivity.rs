//! Per-layer sparsity chosen by measured sensitivity instead of one level for every layer.
//!
//! Layers differ in how much dropping their weakest neurons hurts: a [`Sensitivity`] holds, per
//! layer, the divergence of the next-token distribution (against the dense model) when only that
//! layer drops the given fraction of neurons. [`Sensitivity::allocate`] spends a divergence
//! budget where it saves the most FFN bytes, assuming the layers' divergences add up (the
//! converter checks the result on held-out text, since they only roughly do).

use crate::SparseError;
use serde::{Deserialize, Serialize};

/// Resolution of the per-layer sparsity [`Sensitivity::allocate`] chooses.
pub const SPARSITY_STEP: f32 = 0.05;

/// Measured sensitivity of every FFN layer to threshold sparsity.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sensitivity {
    /// Sparsity levels each layer was measured at: increasing, inside (0, 1).
    pub levels: Vec<f32>,
    /// Per layer, per level: mean KL divergence (nats per token) of the next-token distribution
    /// with only that layer sparse at that level, against the dense model.
    pub kl: Vec<Vec<f64>>,
    /// Tokens the divergences were averaged over.
    pub tokens: usize,
}

impl Sensitivity {
    /// Checks the shape and values (it may come from a file).
    pub fn check(&self, n_layer: usize) -> Result<(), SparseError> {
        let bad = |m: String| Err(SparseError::BadSensitivity(m));
        if self.levels.is_empty() || self.levels.len() > 64 {
            return bad(format!("{} levels (1..64 expected)", self.levels.len()));
        }
        if !self.levels.iter().all(|s| *s > 0.0 && *s < 1.0)
            || !self.levels.windows(2).all(|w| w[0] < w[1])
        {
            return bad("levels must increase inside (0, 1)".into());
        }
        if self.kl.len() != n_layer {
            return bad(format!("{} layers, the model has {n_layer}", self.kl.len()));
        }
        for (l, row) in self.kl.iter().enumerate() {
            if row.len() != self.levels.len() || !row.iter().all(|v| v.is_finite() && *v >= 0.0) {
                return bad(format!(
                    "layer {l}: needs {} finite divergences >= 0",
                    self.levels.len()
                ));
            }
        }
        Ok(())
    }

    /// Layer `layer`'s divergence at sparsity `s`: piecewise linear through (0, 0) and the
    /// measured points, made non-decreasing (measurement noise can dip), continued past the last
    /// level with the last segment's slope.
    pub fn divergence(&self, layer: usize, s: f32) -> f64 {
        let s = f64::from(s.max(0.0));
        let (mut x0, mut y0) = (0.0f64, 0.0f64);
        let mut slope = 0.0;
        for (&x, &y) in self.levels.iter().zip(&self.kl[layer]) {
            let (x, y) = (f64::from(x), y.max(y0));
            slope = (y - y0) / (x - x0);
            if s <= x {
                return y0 + slope * (s - x0);
            }
            (x0, y0) = (x, y);
        }
        y0 + slope * (s - x0)
    }

    /// Per-layer sparsity (multiples of [`SPARSITY_STEP`], at most `max`) that saves the most
    /// bytes while the summed divergence stays within `budget`: `bytes_per_sparsity[l]` is what
    /// layer `l` saves per unit of sparsity (its up rows and down columns). Greedy: each step
    /// raises the layer with the most bytes saved per nat of divergence that still fits.
    pub fn allocate(&self, bytes_per_sparsity: &[f64], budget: f64, max: f32) -> Vec<f32> {
        let n = self.kl.len();
        let top = (max.clamp(0.0, 0.95) / SPARSITY_STEP + 1e-3).floor() as usize;
        let at = |k: usize| k as f32 * SPARSITY_STEP;
        let mut steps = vec![0usize; n];
        let mut spent = 0.0;
        loop {
            let mut best: Option<(usize, f64, f64)> = None;
            for (l, &k) in steps.iter().enumerate() {
                if k >= top {
                    continue;
                }
                let cost = (self.divergence(l, at(k + 1)) - self.divergence(l, at(k))).max(0.0);
                if spent + cost > budget {
                    continue;
                }
                let gain = bytes_per_sparsity.get(l).copied().unwrap_or(0.0).max(0.0);
                let ratio = gain / cost.max(1e-300);
                if best.is_none_or(|(_, r, _)| ratio > r) {
                    best = Some((l, ratio, cost));
                }
            }
            let Some((l, _, cost)) = best else { break };
            steps[l] += 1;
            spent += cost;
        }
        // `top` forgives float error at a multiple of the step: never past `max` itself.
        let max = max.clamp(0.0, 0.95);
        steps.into_iter().map(|k| at(k).min(max)).collect()
    }

    /// The summed divergence [`Sensitivity::allocate`] predicts for per-layer `sparsity`.
    pub fn predicted(&self, sparsity: &[f32]) -> f64 {
        sparsity
            .iter()
            .enumerate()
            .map(|(l, &s)| self.divergence(l, s))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sens(kl: Vec<Vec<f64>>) -> Sensitivity {
        Sensitivity {
            levels: vec![0.3, 0.6],
            kl,
            tokens: 1,
        }
    }

    #[test]
    fn divergence_interpolates_and_extrapolates() {
        let s = sens(vec![vec![0.03, 0.09]]);
        assert!((s.divergence(0, 0.0)).abs() < 1e-12);
        assert!((s.divergence(0, 0.15) - 0.015).abs() < 1e-6);
        assert!((s.divergence(0, 0.45) - 0.06).abs() < 1e-6);
        assert!((s.divergence(0, 0.9) - 0.15).abs() < 1e-6);
        // A noisy dip is flattened, never negative.
        let s = sens(vec![vec![0.05, 0.01]]);
        assert!((s.divergence(0, 0.6) - 0.05).abs() < 1e-6);
    }

    #[test]
    fn zero_budget_keeps_sensitive_layers_dense_and_free_layers_sparse() {
        let s = sens(vec![vec![0.01, 0.02], vec![0.0, 0.0]]);
        let a = s.allocate(&[1.0, 1.0], 0.0, 0.8);
        assert_eq!(a[0], 0.0);
        assert!((a[1] - 0.8).abs() < 1e-6);
    }

    #[test]
    fn check_refuses_bad_shapes_and_values() {
        assert!(sens(vec![vec![0.1, 0.2]]).check(1).is_ok());
        assert!(sens(vec![vec![0.1, 0.2]]).check(2).is_err());
        assert!(sens(vec![vec![0.1]]).check(1).is_err());
        assert!(sens(vec![vec![0.1, f64::NAN]]).check(1).is_err());
        assert!(sens(vec![vec![-0.1, 0.2]]).check(1).is_err());
        let mut s = sens(vec![vec![0.1, 0.2]]);
        s.levels = vec![0.6, 0.3];
        assert!(s.check(1).is_err());
    }

    proptest! {
        #[test]
        fn allocation_fits_the_budget_and_favours_robust_layers(
            curves in proptest::collection::vec((0.0f64..0.1, 0.0f64..0.3), 1..12),
            scale in 1.0f64..10.0,
            budget in 0.0f64..0.5,
            max in 0.0f32..0.95,
        ) {
            // Layer 0 is a scaled-up copy of layer 1: never sparser than it.
            let mut kl: Vec<Vec<f64>> = curves.iter().map(|&(a, b)| vec![a, a + b]).collect();
            kl.insert(0, kl[0].iter().map(|v| v * scale).collect());
            let s = sens(kl);
            let bytes = vec![1.0; s.kl.len()];
            let a = s.allocate(&bytes, budget, max);
            prop_assert!(s.predicted(&a) <= budget + 1e-9);
            prop_assert!(a.iter().all(|&v| (0.0..=max + 1e-6).contains(&v)));
            prop_assert!(a[0] <= a[1] + 1e-6);
        }
    }
}
