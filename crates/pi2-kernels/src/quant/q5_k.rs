//! Q5_K: as Q4_K plus a fifth bit per weight in `qh`: bit `2j` (low half) / `2j+1` (high half) of
//! `qh[l]` belongs to element `l` of the 64-element chunk `j`. `w = d * sc * q - dmin * m`.

use super::{f16_to_f32, scale_min_k4, BlockQ8K, QuantBlock, K_SCALE_SIZE, QK_K};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

impl BlockQ5K {
    /// The 5-bit value of element `i` (0..256).
    #[inline]
    fn q(&self, i: usize) -> u8 {
        let (chunk, rem) = (i / 64, i % 64);
        let l = rem % 32;
        let byte = self.qs[chunk * 32 + l];
        let (low, bit) = if rem < 32 {
            (byte & 0x0F, 2 * chunk)
        } else {
            (byte >> 4, 2 * chunk + 1)
        };
        low | (((self.qh[l] >> bit) & 1) << 4)
    }
}

impl QuantBlock for BlockQ5K {
    const LEN: usize = QK_K;
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (f16_to_f32(self.d), f16_to_f32(self.dmin));
        for (i, o) in out[..QK_K].iter_mut().enumerate() {
            let (sc, m) = scale_min_k4(i / 32, &self.scales);
            *o = d * sc as f32 * self.q(i) as f32 - dmin * m as f32;
        }
    }

    fn vec_dot_ref(w: &[Self], x: &[BlockQ8K]) -> f32 {
        let mut sum = 0.0f32;
        for (wb, xb) in w.iter().zip(x) {
            let (mut scaled, mut mins) = (0i32, 0i32);
            for sb in 0..8 {
                let (sc, m) = scale_min_k4(sb, &wb.scales);
                let isum: i32 = (sb * 32..sb * 32 + 32)
                    .map(|i| wb.q(i) as i32 * xb.qs[i] as i32)
                    .sum();
                scaled += sc as i32 * isum;
                mins += m as i32 * (xb.bsums[2 * sb] as i32 + xb.bsums[2 * sb + 1] as i32);
            }
            sum += super::term::k_min(xb.d, f16_to_f32(wb.d), scaled, f16_to_f32(wb.dmin), mins);
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::super::{f32_to_f16, q8_act::quantize_q8k};
    use super::*;

    #[test]
    fn hand_built_block_dequantizes() {
        let mut b: BlockQ5K = Zeroable::zeroed();
        b.d = f32_to_f16(1.0);
        b.dmin = f32_to_f16(0.5);
        b.scales[0] = 1; // sc0
        b.scales[1] = 1; // sc1
        b.scales[4] = 2; // m0
        b.qs[3] = 0x2F; // element 3 -> 15, element 35 -> 2
        b.qh[3] = 0b0000_0011; // +16 on elements 3 and 35
        let mut out = [0.0; 256];
        b.dequantize(&mut out);
        assert_eq!(out[3], 31.0 - 1.0);
        assert_eq!(out[35], 18.0);
        assert_eq!(out[0], -1.0);
    }

    #[test]
    fn dot_matches_dequantized() {
        let mut b: BlockQ5K = Zeroable::zeroed();
        b.d = f32_to_f16(0.125);
        b.dmin = f32_to_f16(0.0625);
        for (i, s) in b.scales.iter_mut().enumerate() {
            *s = (i as u8).wrapping_mul(53).wrapping_add(7);
        }
        for (i, q) in b.qs.iter_mut().enumerate() {
            *q = (i as u8).wrapping_mul(91);
        }
        for (i, q) in b.qh.iter_mut().enumerate() {
            *q = (i as u8).wrapping_mul(151);
        }
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 7) % 23) as f32 / 5.0 - 2.0)
            .collect();
        let mut a = [BlockQ8K::default()];
        quantize_q8k(&x, &mut a);
        let mut w = [0.0; 256];
        b.dequantize(&mut w);
        let want: f32 = w
            .iter()
            .zip(&a[0].qs)
            .map(|(p, &q)| p * q as f32 * a[0].d)
            .sum();
        let got = BlockQ5K::vec_dot_ref(&[b], &a);
        assert!(
            (got - want).abs() < 1e-2 * want.abs().max(1.0),
            "{got} vs {want}"
        );
    }
}
