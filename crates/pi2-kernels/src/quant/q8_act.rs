//! Activation blocks: the input vector quantized to int8 so weight dot products run on integers.
//!
//! `BlockQ8` (32 values, f32 scale, precomputed `d * sum(q)`) serves Q4_0, Q4_1 and Q8_0 weights;
//! `BlockQ8K` (256 values, f32 scale, 16 partial sums) serves the k-quants. Scales are f32 rather
//! than ggml's f16 so that activation rounding is the only quantization error added here.

use super::{QK, QK_K};
use bytemuck::{Pod, Zeroable};

/// 32 activations as int8 with scale `d`; `s = d * sum(qs)` feeds the min term of Q4_1.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct BlockQ8 {
    pub d: f32,
    pub s: f32,
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8>() == 40);

/// 256 activations as int8 with scale `d` and per-16 sums (the k-quant min terms need them).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

impl Default for BlockQ8K {
    fn default() -> Self {
        Zeroable::zeroed()
    }
}

/// Symmetric int8 quantization of `x` (length a multiple of 32) into `out`.
pub fn quantize_q8(x: &[f32], out: &mut [BlockQ8]) {
    assert_eq!(x.len(), out.len() * QK, "quantize_q8: length mismatch");
    for (xb, yb) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            let r = (v * id).round() as i32;
            *q = r.clamp(-127, 127) as i8;
            sum += *q as i32;
        }
        // Scales pass through f16 as in ggml's Q8_0/Q8_1, so pi2's integer dot products see the
        // same activation values as llama.cpp (reference outputs are compared to it).
        yb.d = super::f16_to_f32(super::f32_to_f16(d));
        yb.s = super::f16_to_f32(super::f32_to_f16(d * sum as f32));
    }
}

/// Symmetric int8 quantization of `x` (length a multiple of 256) into k-quant activation blocks.
pub fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    assert_eq!(x.len(), out.len() * QK_K, "quantize_q8k: length mismatch");
    for (xb, yb) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = ((v * id).round() as i32).clamp(-127, 127) as i8;
        }
        for (s, qs) in yb.bsums.iter_mut().zip(yb.qs.chunks_exact(16)) {
            *s = qs.iter().map(|&q| q as i16).sum();
        }
        yb.d = d;
    }
}

impl BlockQ8 {
    pub fn dequantize(&self, out: &mut [f32]) {
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * self.d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_round_trip_is_within_half_a_step() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.37).collect();
        let mut b = vec![BlockQ8::default(); 2];
        quantize_q8(&x, &mut b);
        let mut y = vec![0.0; 64];
        b[0].dequantize(&mut y[..32]);
        b[1].dequantize(&mut y[32..]);
        for (blk, (xs, ys)) in b.iter().zip(x.chunks(32).zip(y.chunks(32))) {
            for (a, c) in xs.iter().zip(ys) {
                // half a step, plus the f16 rounding of the scale over up to 127 steps
                assert!((a - c).abs() <= blk.d * 0.57 + 1e-6);
            }
            let sum: i32 = blk.qs.iter().map(|&q| q as i32).sum();
            assert!((blk.s - blk.d * sum as f32).abs() <= 1e-3 * (blk.d * sum as f32).abs() + 1e-6);
        }
    }

    #[test]
    fn q8_of_zeros_is_zero() {
        let mut b = vec![BlockQ8::default(); 1];
        quantize_q8(&[0.0; 32], &mut b);
        assert_eq!(b[0].d, 0.0);
        assert!(b[0].qs.iter().all(|&q| q == 0));
    }

    #[test]
    fn q8k_bsums_match() {
        let x: Vec<f32> = (0..256).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        let mut b = vec![BlockQ8K::default(); 1];
        quantize_q8k(&x, &mut b);
        for (i, s) in b[0].bsums.iter().enumerate() {
            let want: i16 = b[0].qs[i * 16..i * 16 + 16].iter().map(|&q| q as i16).sum();
            assert_eq!(*s, want);
        }
        assert_eq!(b[0].qs[0], (-50.0f32 / b[0].d).round() as i8);
    }
}
