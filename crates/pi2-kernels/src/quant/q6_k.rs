//! Q6_K: 256 weights in 16 sub-blocks of 16; 6-bit `q` split in `ql` (low 4 bits) and `qh`
//! (high 2 bits), int8 per-sub-block scales, f16 super-scale; `w = d * sc * (q - 32)`.

use super::{f16_to_f32, BlockQ8K, QuantBlock, QK_K};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: u16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

impl BlockQ6K {
    /// The signed 6-bit value (`q - 32`) of element `i` (0..256).
    #[inline]
    fn q(&self, i: usize) -> i32 {
        // Each half of 128 elements uses 64 bytes of ql and 32 of qh; within a half, the four
        // 32-element quarters take (ql low, ql+32 low, ql high, ql+32 high) and qh bit pairs 0..3.
        let (half, rem) = (i / 128, i % 128);
        let (quarter, l) = (rem / 32, rem % 32);
        let ql = self.ql[half * 64 + l + 32 * (quarter & 1)];
        let low = if quarter < 2 { ql & 0x0F } else { ql >> 4 };
        let high = (self.qh[half * 32 + l] >> (2 * quarter)) & 3;
        (low | (high << 4)) as i32 - 32
    }
}

impl QuantBlock for BlockQ6K {
    const LEN: usize = QK_K;
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (i, o) in out[..QK_K].iter_mut().enumerate() {
            *o = d * self.scales[i / 16] as f32 * self.q(i) as f32;
        }
    }

    fn vec_dot_ref(w: &[Self], x: &[BlockQ8K]) -> f32 {
        let mut sum = 0.0f32;
        for (wb, xb) in w.iter().zip(x) {
            let mut scaled = 0i32;
            for sb in 0..16 {
                let isum: i32 = (sb * 16..sb * 16 + 16)
                    .map(|i| wb.q(i) * xb.qs[i] as i32)
                    .sum();
                scaled += wb.scales[sb] as i32 * isum;
            }
            sum += super::term::scaled(f16_to_f32(wb.d), xb.d, scaled);
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
        let mut b: BlockQ6K = Zeroable::zeroed();
        b.d = f32_to_f16(0.5);
        b.scales = [2; 16];
        b.scales[8] = -1;
        b.ql[0] = 0xA5; // element 0 low=5, element 64 low=A
        b.qh[0] = 0b1110_0100; // element 0 high=0, 32 high=1, 64 high=2, 96 high=3
        b.ql[64] = 0x0F; // second half, element 128 low = 15
        let mut out = [0.0; 256];
        b.dequantize(&mut out);
        assert_eq!(out[0], 0.5 * 2.0 * (5 - 32) as f32);
        assert_eq!(out[32], 0.5 * 2.0 * (16 - 32) as f32);
        assert_eq!(out[64], 0.5 * 2.0 * (0x2A - 32) as f32);
        assert_eq!(out[96], 0.5 * 2.0 * (48 - 32) as f32);
        assert_eq!(out[128], -0.5 * (15 - 32) as f32);
    }

    #[test]
    fn dot_matches_dequantized() {
        let mut b: BlockQ6K = Zeroable::zeroed();
        b.d = f32_to_f16(0.03);
        for (i, s) in b.scales.iter_mut().enumerate() {
            *s = (i as i8).wrapping_mul(23);
        }
        for (i, q) in b.ql.iter_mut().enumerate() {
            *q = (i as u8).wrapping_mul(77);
        }
        for (i, q) in b.qh.iter_mut().enumerate() {
            *q = (i as u8).wrapping_mul(199);
        }
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 11) % 17) as f32 / 3.0 - 2.5)
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
        let got = BlockQ6K::vec_dot_ref(&[b], &a);
        assert!(
            (got - want).abs() < 1e-2 * want.abs().max(1.0),
            "{got} vs {want}"
        );
    }
}
