//! IQ4_XS: 256 weights in 8 sub-blocks of 32, each a 6-bit scale (`ls - 32`, the low four
//! bits in `scales_l`, two per byte, the high two in `scales_h`, two bits per sub-block) times
//! the IQ4_NL levels of its 4-bit indices, one f16 super-scale:
//! `w = d * (ls - 32) * TABLE[q]`. Sub-block `ib`'s 16 bytes of `qs` hold its element `j` in
//! the low nibble and `j + 16` in the high one.

use super::iq4_nl::{level_scale, nearest, IQ4NL_TABLE};
use super::{f16_to_f32, f32_to_f16, BlockQ8K, QuantBlock, QK_K};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIQ4XS {
    pub d: u16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIQ4XS>() == 136);

impl Default for BlockIQ4XS {
    fn default() -> Self {
        Self::zeroed()
    }
}

impl BlockIQ4XS {
    /// Sub-block `ib`'s signed scale, `ls - 32`.
    #[inline]
    pub fn scale(&self, ib: usize) -> i32 {
        let low = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let high = ((self.scales_h >> (2 * ib)) & 3) as u8;
        (low | (high << 4)) as i32 - 32
    }

    /// A plain quantizer for tests and generated models: each sub-block's scale maps its signed
    /// extreme onto the table's end, the super-scale makes the largest of them 31, each weight
    /// takes its nearest level (GGML's quantizer searches further).
    pub fn quantize(x: &[f32]) -> Self {
        assert_eq!(x.len(), QK_K);
        let sub: Vec<f32> = x.chunks_exact(32).map(level_scale).collect();
        let d = sub.iter().fold(0.0f32, |m, &s| m.max(s)) / 31.0;
        let d16 = f32_to_f16(d);
        let d = f16_to_f32(d16);
        let mut b = Self {
            d: d16,
            ..Self::default()
        };
        for (ib, (c, &s)) in x.chunks_exact(32).zip(&sub).enumerate() {
            // Rounded up, so the sub-block's extreme stays within the table's range.
            let ls = if d > 0.0 {
                ((s / d).ceil() as i32).clamp(-32, 31)
            } else {
                0
            };
            let code = (ls + 32) as u8;
            b.scales_l[ib / 2] |= (code & 0x0F) << (4 * (ib % 2));
            b.scales_h |= ((code >> 4) as u16) << (2 * ib);
            let dl = d * ls as f32;
            let id = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 0..16 {
                b.qs[16 * ib + j] = nearest(c[j] * id) | (nearest(c[j + 16] * id) << 4);
            }
        }
        b
    }
}

impl QuantBlock for BlockIQ4XS {
    const LEN: usize = QK_K;
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for ib in 0..QK_K / 32 {
            let dl = d * self.scale(ib) as f32;
            let (qs, o) = (
                &self.qs[16 * ib..16 * ib + 16],
                &mut out[32 * ib..32 * ib + 32],
            );
            for j in 0..16 {
                o[j] = dl * IQ4NL_TABLE[(qs[j] & 0x0F) as usize] as f32;
                o[j + 16] = dl * IQ4NL_TABLE[(qs[j] >> 4) as usize] as f32;
            }
        }
    }

    fn vec_dot_ref(w: &[Self], x: &[BlockQ8K]) -> f32 {
        let mut sum = 0.0f32;
        for (wb, xb) in w.iter().zip(x) {
            let mut isum = 0i32;
            for ib in 0..QK_K / 32 {
                let (qs, xs) = (&wb.qs[16 * ib..16 * ib + 16], &xb.qs[32 * ib..32 * ib + 32]);
                let mut s = 0i32;
                for j in 0..16 {
                    s += IQ4NL_TABLE[(qs[j] & 0x0F) as usize] as i32 * xs[j] as i32;
                    s += IQ4NL_TABLE[(qs[j] >> 4) as usize] as i32 * xs[j + 16] as i32;
                }
                isum += wb.scale(ib) * s;
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
        // d = 0.25; sub-block ib has ls - 32 = ib - 4 (code ib + 28: low nibble and high bits
        // split), every index equal to ib.
        let mut b = BlockIQ4XS {
            d: f32_to_f16(0.25),
            ..BlockIQ4XS::default()
        };
        for ib in 0..8 {
            let code = ib as u8 + 28;
            b.scales_l[ib / 2] |= (code & 0x0F) << (4 * (ib % 2));
            b.scales_h |= ((code >> 4) as u16) << (2 * ib);
            b.qs[16 * ib..16 * ib + 16].fill(ib as u8 | ((ib as u8) << 4));
        }
        let mut out = [0.0; QK_K];
        b.dequantize(&mut out);
        for ib in 0..8 {
            assert_eq!(b.scale(ib), ib as i32 - 4);
            let want = 0.25 * (ib as f32 - 4.0) * IQ4NL_TABLE[ib] as f32;
            assert!(
                out[32 * ib..32 * ib + 32].iter().all(|&v| v == want),
                "{ib}"
            );
        }
    }

    #[test]
    fn quantize_round_trips_closely() {
        let x: Vec<f32> = (0..QK_K)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01 * (1 + i / 32) as f32)
            .collect();
        let b = BlockIQ4XS::quantize(&x);
        let mut out = vec![0.0; QK_K];
        b.dequantize(&mut out);
        for (ib, (o, v)) in out.chunks(32).zip(x.chunks(32)).enumerate() {
            let range = v.iter().fold(0.0f32, |m, a| m.max(a.abs()));
            for (a, b) in o.iter().zip(v) {
                // Half the widest gap between levels (24 of 113), widened by the 6-bit scale's
                // rounding up (a third at most for these sub-blocks' scales of 3 and more).
                assert!((a - b).abs() <= range * 0.15, "sub-block {ib}: {a} vs {b}");
            }
        }
    }
}
