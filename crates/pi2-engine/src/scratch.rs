//! What a forward pass works in: reused activation buffers, and the numeric pieces every
//! stage shares (RMS norm, RoPE).

use pi2_kernels::ActBuf;
use pi2_model::RopeKind;

/// Reused activation buffers (grown on demand, never shrunk).
#[derive(Default)]
pub(crate) struct Scratch {
    /// The residual stream, token-major.
    pub x: Vec<f32>,
    /// Its normalised copy (input of the projections).
    pub xn: Vec<f32>,
    /// The residual stream set aside while a block whose output is normalised runs.
    pub resid: Vec<f32>,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub att: Vec<f32>,
    pub o: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub logits: Vec<f32>,
    pub acts: ActBuf,
    /// RoPE of the batch's positions: global layers', and sliding-window layers' when those
    /// have their own base.
    pub rope: RopeTables,
    pub rope_local: RopeTables,
    /// Predictor hidden activations and scores.
    pub pred_h: Vec<f32>,
    pub pred_s: Vec<f32>,
    /// Per-task (or per-cluster) partial outputs.
    pub partials: Vec<f32>,
    /// A recurrent layer's state as its batch runs.
    pub state: Vec<f32>,
    /// Each token's per-layer inputs (Gemma 4): `n_layer` slices per token.
    pub per_layer: Vec<f32>,
}

/// `v[..n]`, growing `v` with zeros first if it is shorter.
pub(crate) fn grow(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// `out = x / rms(x) * w`.
/// `bias` added to every row of `rows` (nothing without one).
pub(crate) fn add_rows(rows: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        rows.chunks_exact_mut(b.len())
            .for_each(|r| r.iter_mut().zip(b).for_each(|(y, bb)| *y += bb));
    }
}

pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (ms + eps).sqrt();
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = xi * r * wi;
    }
}

/// `x = x / rms(x) * w`.
pub(crate) fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter_mut().zip(w).for_each(|(v, &wi)| *v = *v * r * wi);
}

/// RMS-normalise `n` rows of `d` from `x` into `xn`.
pub(crate) fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, d: usize, n: usize, xn: &mut Vec<f32>) {
    let out = grow(xn, n * d);
    for (xr, or) in x[..n * d].chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        rms_norm(xr, w, eps, or);
    }
}

/// Rotate the first `n_rot` dims of one head.
pub(crate) fn rope(h: &mut [f32], n_rot: usize, kind: RopeKind, cos: &[f32], sin: &[f32]) {
    let half = n_rot / 2;
    for i in 0..half {
        let (a, b) = match kind {
            RopeKind::Norm => (2 * i, 2 * i + 1),
            RopeKind::Neox => (i, i + half),
        };
        let (x0, x1) = (h[a], h[b]);
        h[a] = x0 * cos[i] - x1 * sin[i];
        h[b] = x0 * sin[i] + x1 * cos[i];
    }
}

/// cos/sin of every (token, frequency) pair of a batch, token-major.
#[derive(Default)]
pub(crate) struct RopeTables {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl RopeTables {
    /// The tables of positions `pos0..pos0 + n`, times `mscale` (ggml's `attn_factor`: the
    /// rotated dimensions of Q and K are scaled by it, the others not).
    pub fn fill(&mut self, inv_freq: &[f32], mscale: f32, pos0: usize, n: usize) {
        let half = inv_freq.len();
        let cos = grow(&mut self.cos, n * half);
        for t in 0..n {
            for (i, f) in inv_freq.iter().enumerate() {
                cos[t * half + i] = ((pos0 + t) as f32 * f).cos() * mscale;
            }
        }
        let sin = grow(&mut self.sin, n * half);
        for t in 0..n {
            for (i, f) in inv_freq.iter().enumerate() {
                sin[t * half + i] = ((pos0 + t) as f32 * f).sin() * mscale;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_weights() {
        let mut out = [0.0; 4];
        rms_norm(&[1.0, -1.0, 1.0, -1.0], &[1.0; 4], 0.0, &mut out);
        assert_eq!(out, [1.0, -1.0, 1.0, -1.0]);
        rms_norm(&[2.0, 0.0, 0.0, 0.0], &[1.0, 1.0, 1.0, 3.0], 0.0, &mut out);
        assert_eq!(out, [2.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn rope_pairs_by_kind() {
        let (cos, sin) = ([0.0, 1.0], [1.0, 0.0]); // rotate pair 0 by 90 degrees, pair 1 by 0
        let mut h = [1.0, 2.0, 3.0, 4.0];
        rope(&mut h, 4, RopeKind::Norm, &cos, &sin);
        assert_eq!(h, [-2.0, 1.0, 3.0, 4.0]);
        let mut h = [1.0, 2.0, 3.0, 4.0];
        rope(&mut h, 4, RopeKind::Neox, &cos, &sin);
        assert_eq!(h, [-3.0, 2.0, 1.0, 4.0]);
    }
}
