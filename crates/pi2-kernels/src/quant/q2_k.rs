//! Q2_K and Q3_K: 256 weights in 16 sub-blocks of 16 with 2 low bits per weight in `qs`
//! (Q3_K adds a third, inverted, in `hmask`). Element `128h + 32j + 16p + l` (h half, j bit
//! pair, p part, l 0..16) is bits `2j..2j+2` of `qs[32h + 16p + l]` and belongs to sub-block
//! `8h + 2j + p`; Q3_K's third bit is bit `4h + j` of `hmask[16p + l]`.
//! Q2_K: `w = d * sc * q - dmin * m` with 4-bit `sc` and `m` per sub-block.
//! Q3_K: `w = d * (s - 32) * (q - 4 * !hbit)` with 6-bit `s` packed in 12 bytes.

use super::{f16_to_f32, BlockQ8K, QuantBlock, QK_K};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ2K {
    /// Sub-block `i`: scale in the low nibble, min in the high one.
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: u16,
    pub dmin: u16,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: u16,
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

/// The two low bits of element `i`.
#[inline]
fn low_bits(qs: &[u8; 64], i: usize) -> u8 {
    let (h, r) = (i / 128, i % 128);
    let (j, p, l) = (r / 32, (r % 32) / 16, r % 16);
    (qs[32 * h + 16 * p + l] >> (2 * j)) & 3
}

impl BlockQ3K {
    /// The 16 signed sub-block scales (`s - 32`): bytes 0..8 hold the low nibbles of scales
    /// 0..8 (low nibble) and 8..16 (high nibble), bytes 8..12 the high two bits, four per byte.
    pub fn sub_scales(&self) -> [i32; 16] {
        let mut out = [0i32; 16];
        for (i, o) in out.iter_mut().enumerate() {
            let low = (self.scales[i % 8] >> (4 * (i / 8))) & 0x0F;
            let high = (self.scales[8 + i % 4] >> (2 * (i / 4))) & 3;
            *o = (low | (high << 4)) as i32 - 32;
        }
        out
    }

    /// The signed 3-bit value of element `i` (-4..=3).
    #[inline]
    fn q(&self, i: usize) -> i32 {
        let (h, r) = (i / 128, i % 128);
        let (j, p, l) = (r / 32, (r % 32) / 16, r % 16);
        let set = self.hmask[16 * p + l] & (1 << (4 * h + j)) != 0;
        low_bits(&self.qs, i) as i32 - if set { 0 } else { 4 }
    }
}

impl QuantBlock for BlockQ2K {
    const LEN: usize = QK_K;
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (f16_to_f32(self.d), f16_to_f32(self.dmin));
        for (i, o) in out[..QK_K].iter_mut().enumerate() {
            let sc = self.scales[i / 16];
            *o = d * (sc & 0x0F) as f32 * low_bits(&self.qs, i) as f32 - dmin * (sc >> 4) as f32;
        }
    }

    fn vec_dot_ref(w: &[Self], x: &[BlockQ8K]) -> f32 {
        let mut sum = 0.0f32;
        for (wb, xb) in w.iter().zip(x) {
            let (mut scaled, mut mins) = (0i32, 0i32);
            for sb in 0..16 {
                let isum: i32 = (sb * 16..sb * 16 + 16)
                    .map(|i| low_bits(&wb.qs, i) as i32 * xb.qs[i] as i32)
                    .sum();
                scaled += (wb.scales[sb] & 0x0F) as i32 * isum;
                mins += (wb.scales[sb] >> 4) as i32 * xb.bsums[sb] as i32;
            }
            sum += super::term::k_min(xb.d, f16_to_f32(wb.d), scaled, f16_to_f32(wb.dmin), mins);
        }
        sum
    }
}

impl QuantBlock for BlockQ3K {
    const LEN: usize = QK_K;
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let s = self.sub_scales();
        for (i, o) in out[..QK_K].iter_mut().enumerate() {
            *o = d * s[i / 16] as f32 * self.q(i) as f32;
        }
    }

    fn vec_dot_ref(w: &[Self], x: &[BlockQ8K]) -> f32 {
        let mut sum = 0.0f32;
        for (wb, xb) in w.iter().zip(x) {
            let s = wb.sub_scales();
            let mut scaled = 0i32;
            for (sb, &sc) in s.iter().enumerate() {
                let isum: i32 = (sb * 16..sb * 16 + 16)
                    .map(|i| wb.q(i) * xb.qs[i] as i32)
                    .sum();
                scaled += sc * isum;
            }
            sum += super::term::scaled(f16_to_f32(wb.d), xb.d, scaled);
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::f32_to_f16;

    #[test]
    fn q2k_hand_built_block_dequantizes() {
        // d = 1, dmin = 0.5; sub-block sb has scale sb % 16 and min 1; every 2-bit value is 2
        // except element 0 (3) and element 255 (0).
        let mut b = BlockQ2K {
            scales: [0; 16],
            qs: [0b1010_1010; 64],
            d: f32_to_f16(1.0),
            dmin: f32_to_f16(0.5),
        };
        for sb in 0..16 {
            b.scales[sb] = (sb as u8) | (1 << 4);
        }
        b.qs[0] = (b.qs[0] & !3) | 3; // element 0: h 0, j 0, p 0, l 0
        b.qs[32 + 16 + 15] &= !(3 << 6); // element 255: h 1, j 3, p 1, l 15
        let mut out = [0.0; QK_K];
        b.dequantize(&mut out);
        assert_eq!(out[0], 0.0 * 3.0 - 0.5);
        assert_eq!(out[16], 1.0 * 2.0 - 0.5);
        assert_eq!(out[255], -0.5);
        assert_eq!(out[254], 15.0 * 2.0 - 0.5);
    }

    #[test]
    fn q3k_scales_and_signs_unpack() {
        // Scale i is i * 4 - 32 + 32 = 4i (6 bits: low nibble and high pair split).
        let mut b = BlockQ3K {
            hmask: [0xFF; 32],
            qs: [0; 64],
            scales: [0; 12],
            d: f32_to_f16(0.5),
        };
        for i in 0..16 {
            let code = (4 * i) as u8;
            b.scales[i % 8] |= (code & 0x0F) << (4 * (i / 8));
            b.scales[8 + i % 4] |= (code >> 4) << (2 * (i / 4));
        }
        let s = b.sub_scales();
        assert_eq!(s.to_vec(), (0..16).map(|i| 4 * i - 32).collect::<Vec<_>>());
        // All high bits set: q = low bits (0); clear element 130's (h 1, j 0, p 0, l 2): -4.
        b.qs[32 + 2] = 3; // element 130 low bits 3 (j 0)
        b.hmask[2] &= !(1 << 4);
        let mut out = [0.0; QK_K];
        b.dequantize(&mut out);
        assert_eq!(out[130], 0.5 * s[8] as f32 * (3.0 - 4.0));
        assert!(out[..130].iter().all(|&v| v == 0.0));
    }
}
