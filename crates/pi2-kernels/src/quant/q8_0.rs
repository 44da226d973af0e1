//! Q8_0: 32 weights as int8 with one f16 scale; `w = q * d`.

use super::{f16_to_f32, f32_to_f16, BlockQ8, QuantBlock, QK};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    pub d: u16,
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

impl BlockQ8_0 {
    /// Reference quantizer: `d = amax / 127`.
    pub fn quantize(x: &[f32]) -> Self {
        assert_eq!(x.len(), QK);
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; QK];
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round().clamp(-128.0, 127.0) as i8;
        }
        Self {
            d: f32_to_f16(d),
            qs,
        }
    }
}

impl QuantBlock for BlockQ8_0 {
    const LEN: usize = QK;
    type Act = BlockQ8;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }

    fn vec_dot_ref(w: &[Self], x: &[BlockQ8]) -> f32 {
        let mut sum = 0.0f32;
        for (wb, xb) in w.iter().zip(x) {
            let isum: i32 = wb
                .qs
                .iter()
                .zip(&xb.qs)
                .map(|(&a, &b)| a as i32 * b as i32)
                .sum();
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
        let mut b = BlockQ8_0 {
            d: f32_to_f16(0.25),
            qs: [0; 32],
        };
        b.qs[0] = -128;
        b.qs[31] = 127;
        let mut out = [1.0; 32];
        b.dequantize(&mut out);
        assert_eq!(out[0], -32.0);
        assert_eq!(out[31], 31.75);
        assert_eq!(out[1], 0.0);
    }

    #[test]
    fn dot_of_extremes_does_not_overflow() {
        let w = BlockQ8_0 {
            d: f32_to_f16(1.0),
            qs: [-128; 32],
        };
        let x = BlockQ8 {
            d: 1.0,
            s: 0.0,
            qs: [-127; 32],
        };
        assert_eq!(BlockQ8_0::vec_dot_ref(&[w], &[x]), 32.0 * 128.0 * 127.0);
    }
}
