//! IQ4_NL: 32 weights as 4-bit indices into a fixed non-linear table of 16 signed values,
//! one f16 scale; `w = d * TABLE[q]`. Nibble layout as Q4_0 (byte `j`: element `j` in the low
//! nibble, element `j + 16` in the high one). The table's values come from GGML's format.

use super::{f16_to_f32, f32_to_f16, BlockQ8, QuantBlock, QK};
use bytemuck::{Pod, Zeroable};

/// The 16 levels, denser near zero where weights crowd.
pub const IQ4NL_TABLE: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct BlockIQ4NL {
    pub d: u16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIQ4NL>() == 18);

/// The index of the table value nearest `v` (the lower index on a tie).
pub(super) fn nearest(v: f32) -> u8 {
    let mut best = 0;
    for (i, &t) in IQ4NL_TABLE.iter().enumerate() {
        if (v - t as f32).abs() < (v - IQ4NL_TABLE[best] as f32).abs() {
            best = i;
        }
    }
    best as u8
}

/// The scale that maps the signed extreme of `x` onto the table's end of the same sign.
pub(super) fn level_scale(x: &[f32]) -> f32 {
    let max = x
        .iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    if max < 0.0 {
        max / -127.0
    } else {
        max / 113.0
    }
}

impl BlockIQ4NL {
    /// A plain quantizer for tests and generated models: the scale maps the signed extreme
    /// onto the table's end of the same sign, each weight takes its nearest level (GGML's
    /// quantizer also searches scales; files made by llama.cpp are read as they are).
    pub fn quantize(x: &[f32]) -> Self {
        assert_eq!(x.len(), QK);
        let d = level_scale(x);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        for j in 0..QK / 2 {
            qs[j] = nearest(x[j] * id) | (nearest(x[j + QK / 2] * id) << 4);
        }
        Self {
            d: f32_to_f16(d),
            qs,
        }
    }
}

impl QuantBlock for BlockIQ4NL {
    const LEN: usize = QK;
    type Act = BlockQ8;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for j in 0..QK / 2 {
            out[j] = IQ4NL_TABLE[(self.qs[j] & 0x0F) as usize] as f32 * d;
            out[j + QK / 2] = IQ4NL_TABLE[(self.qs[j] >> 4) as usize] as f32 * d;
        }
    }

    fn vec_dot_ref(w: &[Self], x: &[BlockQ8]) -> f32 {
        let mut sum = 0.0f32;
        for (wb, xb) in w.iter().zip(x) {
            let mut isum = 0i32;
            for j in 0..QK / 2 {
                isum += IQ4NL_TABLE[(wb.qs[j] & 0x0F) as usize] as i32 * xb.qs[j] as i32;
                isum += IQ4NL_TABLE[(wb.qs[j] >> 4) as usize] as i32 * xb.qs[j + QK / 2] as i32;
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
        // d = 0.5; element j has index j % 16, element j + 16 has index 15 - j % 16.
        let mut b = BlockIQ4NL {
            d: f32_to_f16(0.5),
            qs: [0; 16],
        };
        for j in 0..16 {
            b.qs[j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut out = [0.0; 32];
        b.dequantize(&mut out);
        for j in 0..16 {
            assert_eq!(out[j], IQ4NL_TABLE[j] as f32 * 0.5);
            assert_eq!(out[j + 16], IQ4NL_TABLE[15 - j] as f32 * 0.5);
        }
    }

    #[test]
    fn quantize_keeps_the_extreme_and_the_levels() {
        let mut x: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.01).collect();
        x[5] = -1.27;
        let b = BlockIQ4NL::quantize(&x);
        let mut out = [0.0; 32];
        b.dequantize(&mut out);
        assert!((out[5] + 1.27).abs() < 1e-3, "{}", out[5]);
        // Every weight is within half the widest gap between levels (24 steps of 0.01).
        for (o, v) in out.iter().zip(&x) {
            assert!((o - v).abs() <= 0.12 + 1e-3, "{o} vs {v}");
        }
    }
}
