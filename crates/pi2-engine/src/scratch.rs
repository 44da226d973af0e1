//! What a forward pass works in: reused activation buffers, the KV cache, and the numeric
//! pieces every stage shares (RMS norm, RoPE).

use half::f16;
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
}

/// `v[..n]`, growing `v` with zeros first if it is shorter.
pub(crate) fn grow(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// Per-layer key/value cache in f16 (llama.cpp's default: half the memory of f32, and the
/// rounding the reference outputs were made with), grown as positions are used.
pub(crate) struct KvCache {
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    /// Positions held.
    pub len: usize,
    /// Positions it may hold.
    n_ctx: usize,
}

impl KvCache {
    pub fn new(layers: usize, n_ctx: usize) -> Self {
        Self {
            k: vec![Vec::new(); layers],
            v: vec![Vec::new(); layers],
            len: 0,
            n_ctx,
        }
    }

    /// Stores layer `li`'s keys and values of positions `pos0..pos0 + n` (`kvd` wide each)
    /// and returns the layer's whole cache as f16 bits, (keys, values). Grows in steps, so
    /// decode does not reallocate every token.
    pub fn append(
        &mut self,
        li: usize,
        pos0: usize,
        k: &[f32],
        v: &[f32],
        kvd: usize,
    ) -> (&[u16], &[u16]) {
        let n = k.len() / kvd;
        let (kc, vc) = (&mut self.k[li], &mut self.v[li]);
        let need = (pos0 + n) * kvd;
        if kc.len() < need {
            let cap = need.max(kc.len() * 2).min(self.n_ctx * kvd).max(need);
            kc.resize(cap, f16::ZERO);
            vc.resize(cap, f16::ZERO);
        }
        for (dst, &src) in kc[pos0 * kvd..need].iter_mut().zip(k) {
            *dst = f16::from_f32(src);
        }
        for (dst, &src) in vc[pos0 * kvd..need].iter_mut().zip(v) {
            *dst = f16::from_f32(src);
        }
        (bytemuck::cast_slice(&kc[..]), bytemuck::cast_slice(&vc[..]))
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(|b| b.capacity() * 2).sum()
    }
}

/// `out = x / rms(x) * w`.
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
    /// The tables of positions `pos0..pos0 + n`.
    pub fn fill(&mut self, inv_freq: &[f32], pos0: usize, n: usize) {
        let half = inv_freq.len();
        let cos = grow(&mut self.cos, n * half);
        for t in 0..n {
            for (i, f) in inv_freq.iter().enumerate() {
                cos[t * half + i] = ((pos0 + t) as f32 * f).cos();
            }
        }
        let sin = grow(&mut self.sin, n * half);
        for t in 0..n {
            for (i, f) in inv_freq.iter().enumerate() {
                sin[t * half + i] = ((pos0 + t) as f32 * f).sin();
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

    #[test]
    fn kv_cache_grows_in_steps_and_returns_the_layer() {
        let mut kv = KvCache::new(2, 8);
        let (k, v) = kv.append(1, 0, &[1.0, 2.0], &[3.0, 4.0], 2);
        assert_eq!((k.len(), v.len()), (2, 2));
        assert_eq!(f16::from_bits(v[1]).to_f32(), 4.0);
        let (k, _) = kv.append(1, 1, &[5.0, 6.0], &[7.0, 8.0], 2);
        assert_eq!(k.len(), 4, "doubled");
        assert_eq!(f16::from_bits(k[2]).to_f32(), 5.0);
        assert!(kv.bytes() >= 16);
    }
}
