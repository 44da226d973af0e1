//! Q4_0: 32 weights as 4-bit unsigned `q` with one f16 scale; `w = (q - 8) * d`.
//! Byte `j` of `qs` holds element `j` in its low nibble and element `j + 16` in its high nibble.

use super::{f16_to_f32, f32_to_f16, BlockQ8, QuantBlock, QK};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    pub d: u16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

impl BlockQ4_0 {
    /// Reference quantizer (ggml's rounding: scale from the signed extreme, `d = max / -8`).
    pub fn quantize(x: &[f32]) -> Self {
        assert_eq!(x.len(), QK);
        let mut max = 0.0f32;
        for &v in x {
            if v.abs() > max.abs() {
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        for j in 0..QK / 2 {
            let q0 = ((x[j] * id + 8.5) as i32).clamp(0, 15) as u8;
            let q1 = ((x[j + QK / 2] * id + 8.5) as i32).clamp(0, 15) as u8;
            qs[j] = q0 | (q1 << 4);
        }
        Self {
            d: f32_to_f16(d),
            qs,
        }
    }
}

impl QuantBlock for BlockQ4_0 {
    const LEN: usize = QK;
    type Act = BlockQ8;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for j in 0..QK / 2 {
            out[j] = ((self.qs[j] & 0x0F) as i32 - 8) as f32 * d;
            out[j + QK / 2] = ((self.qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }

    fn vec_dot_ref(w: &[Self], x: &[BlockQ8]) -> f32 {
        let mut sum = 0.0f32;
        for (wb, xb) in w.iter().zip(x) {
            let mut isum = 0i32;
            for j in 0..QK / 2 {
                isum += ((wb.qs[j] & 0x0F) as i32 - 8) * xb.qs[j] as i32;
                isum += ((wb.qs[j] >> 4) as i32 - 8) * xb.qs[j + QK / 2] as i32;
            }
            sum += super::term::scaled(f16_to_f32(wb.d), xb.d, isum);
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_built_block_dequantizes() {
        // d = 0.5; element j has nibble j % 16, element j + 16 has nibble 15 - j % 16.
        let mut b = BlockQ4_0 {
            d: f32_to_f16(0.5),
            qs: [0; 16],
        };
        for j in 0..16 {
            b.qs[j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut out = [0.0; 32];
        b.dequantize(&mut out);
        assert_eq!(out[0], -4.0);
        assert_eq!(out[15], 3.5);
        assert_eq!(out[16], 3.5);
        assert_eq!(out[31], -4.0);
    }

    #[test]
    fn quantize_round_trip() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) / 4.0).collect();
        let b = BlockQ4_0::quantize(&x);
        let mut y = [0.0; 32];
        b.dequantize(&mut y);
        let d = f16_to_f32(b.d).abs();
        for (a, c) in x.iter().zip(&y) {
            assert!((a - c).abs() <= d * 0.51, "{a} vs {c}");
        }
    }

    #[test]
    fn dot_matches_dequantized() {
        let mut b = BlockQ4_0 {
            d: f32_to_f16(0.25),
            qs: [0; 16],
        };
        for j in 0..16 {
            b.qs[j] = (j as u8 * 7 % 16) | ((j as u8 * 3 % 16) << 4);
        }
        let mut a = BlockQ8 {
            d: 0.125,
            s: 0.0,
            qs: [0; 32],
        };
        for (i, q) in a.qs.iter_mut().enumerate() {
            *q = (i as i8 - 16) * 3;
        }
        let (mut w, mut x) = ([0.0; 32], [0.0; 32]);
        b.dequantize(&mut w);
        a.dequantize(&mut x);
        let want: f32 = w.iter().zip(&x).map(|(p, q)| p * q).sum();
        assert!((BlockQ4_0::vec_dot_ref(&[b], &[a]) - want).abs() < 1e-4);
    }
}
