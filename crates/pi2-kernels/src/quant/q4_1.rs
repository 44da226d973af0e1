//! Q4_1: 32 weights as 4-bit unsigned `q` with f16 scale `d` and f16 minimum `m`; `w = q * d + m`.
//! Nibble layout as Q4_0. The dot product uses the activation block's `s = d_x * sum(q_x)`.

use super::{f16_to_f32, f32_to_f16, BlockQ8, QuantBlock, QK};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    pub d: u16,
    pub m: u16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

impl BlockQ4_1 {
    /// Reference quantizer: `d = (max - min) / 15`, `m = min`.
    pub fn quantize(x: &[f32]) -> Self {
        assert_eq!(x.len(), QK);
        let min = x.iter().cloned().fold(f32::INFINITY, f32::min);
        let max = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        for j in 0..QK / 2 {
            let q0 = (((x[j] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
            let q1 = (((x[j + QK / 2] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
            qs[j] = q0 | (q1 << 4);
        }
        Self {
            d: f32_to_f16(d),
            m: f32_to_f16(min),
            qs,
        }
    }
}

impl QuantBlock for BlockQ4_1 {
    const LEN: usize = QK;
    type Act = BlockQ8;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (f16_to_f32(self.d), f16_to_f32(self.m));
        for j in 0..QK / 2 {
            out[j] = (self.qs[j] & 0x0F) as f32 * d + m;
            out[j + QK / 2] = (self.qs[j] >> 4) as f32 * d + m;
        }
    }

    fn vec_dot_ref(w: &[Self], x: &[BlockQ8]) -> f32 {
        let mut sum = 0.0f32;
        for (wb, xb) in w.iter().zip(x) {
            let mut isum = 0i32;
            for j in 0..QK / 2 {
                isum += (wb.qs[j] & 0x0F) as i32 * xb.qs[j] as i32;
                isum += (wb.qs[j] >> 4) as i32 * xb.qs[j + QK / 2] as i32;
            }
            sum += super::term::with_min(f16_to_f32(wb.d), xb.d, isum, f16_to_f32(wb.m), xb.s);
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_built_block_dequantizes() {
        let mut b = BlockQ4_1 {
            d: f32_to_f16(2.0),
            m: f32_to_f16(-1.0),
            qs: [0; 16],
        };
        b.qs[0] = 0x3F; // element 0 -> 15, element 16 -> 3
        b.qs[5] = 0x01;
        let mut out = [0.0; 32];
        b.dequantize(&mut out);
        assert_eq!(out[0], 29.0);
        assert_eq!(out[16], 5.0);
        assert_eq!(out[5], 1.0);
        assert_eq!(out[21], -1.0);
    }

    #[test]
    fn quantize_round_trip() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32).sin() * 3.0 + 1.0).collect();
        let b = BlockQ4_1::quantize(&x);
        let mut y = [0.0; 32];
        b.dequantize(&mut y);
        let d = f16_to_f32(b.d);
        for (a, c) in x.iter().zip(&y) {
            assert!((a - c).abs() <= d * 0.51 + 1e-2, "{a} vs {c}");
        }
    }

    #[test]
    fn dot_matches_dequantized() {
        let mut b = BlockQ4_1 {
            d: f32_to_f16(0.5),
            m: f32_to_f16(-2.0),
            qs: [0; 16],
        };
        for j in 0..16 {
            b.qs[j] = (j as u8 * 5 % 16) | ((j as u8 * 11 % 16) << 4);
        }
        let x: Vec<f32> = (0..32).map(|i| (i as f32 * 0.7).cos()).collect();
        let mut a = [BlockQ8::default()];
        super::super::q8_act::quantize_q8(&x, &mut a);
        let (mut w, mut xq) = ([0.0; 32], [0.0; 32]);
        b.dequantize(&mut w);
        a[0].dequantize(&mut xq);
        let want: f32 = w.iter().zip(&xq).map(|(p, q)| p * q).sum();
        assert!((BlockQ4_1::vec_dot_ref(&[b], &a) - want).abs() < 1e-3);
    }
}
