//! Q4_K: 256 weights in 8 sub-blocks of 32; 4-bit `q`, 6-bit per-sub-block scale `sc` and min `m`
//! packed in 12 bytes, f16 super-scales `d`, `dmin`; `w = d * sc * q - dmin * m`.
//! Each 32 bytes of `qs` hold two sub-blocks: low nibbles first, then high nibbles.

use super::{f16_to_f32, f32_to_f16, scale_min_k4, BlockQ8K, QuantBlock, K_SCALE_SIZE, QK_K};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

impl BlockQ4K {
    /// The 4-bit value of element `i` (0..256).
    #[inline]
    fn q(&self, i: usize) -> u8 {
        let (chunk, rem) = (i / 64, i % 64);
        let byte = self.qs[chunk * 32 + rem % 32];
        if rem < 32 {
            byte & 0x0F
        } else {
            byte >> 4
        }
    }
}

impl BlockQ4K {
    /// Quantize 256 values: per sub-block of 32 the range `[min(0, lo), hi]` in 15 steps, the
    /// sub-block scales and mins in 6 bits relative to the block's largest (`d`, `dmin`), then
    /// each value to the nearest of its sub-block's 16 levels.
    pub fn quantize(x: &[f32]) -> Self {
        assert_eq!(x.len(), QK_K);
        let mut scale = [0.0f32; 8];
        let mut min = [0.0f32; 8];
        for (sb, v) in x.chunks_exact(32).enumerate() {
            let lo = v.iter().cloned().fold(0.0f32, f32::min);
            let hi = v.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            scale[sb] = (hi - lo) / 15.0;
            min[sb] = -lo;
        }
        let max_scale = scale.iter().cloned().fold(0.0f32, f32::max);
        let max_min = min.iter().cloned().fold(0.0f32, f32::max);
        // The stored f16 super-scales are what dequantization multiplies by.
        let d = f16_to_f32(f32_to_f16(max_scale / 63.0));
        let dmin = f16_to_f32(f32_to_f16(max_min / 63.0));
        let six = |v: f32, unit: f32| {
            if unit > 0.0 {
                ((v / unit).round() as i32).clamp(0, 63) as u8
            } else {
                0
            }
        };
        let mut b: BlockQ4K = Zeroable::zeroed();
        b.d = f32_to_f16(d);
        b.dmin = f32_to_f16(dmin);
        let mut scs = [0u8; 8];
        let mut ms = [0u8; 8];
        for sb in 0..8 {
            // Round the scale up where rounding down would clip the sub-block's top value.
            let mut sc = six(scale[sb], d);
            if sc < 63 && (sc as f32) * d < scale[sb] {
                sc += 1;
            }
            scs[sb] = sc;
            ms[sb] = six(min[sb], dmin);
        }
        for j in 0..4 {
            b.scales[j] = scs[j] | ((scs[j + 4] >> 4) << 6);
            b.scales[j + 4] = ms[j] | ((ms[j + 4] >> 4) << 6);
            b.scales[j + 8] = (scs[j + 4] & 0x0F) | ((ms[j + 4] & 0x0F) << 4);
        }
        for (i, &v) in x.iter().enumerate() {
            let sb = i / 32;
            let step = d * scs[sb] as f32;
            let q = if step > 0.0 {
                (((v + dmin * ms[sb] as f32) / step).round() as i32).clamp(0, 15) as u8
            } else {
                0
            };
            let (chunk, rem) = (i / 64, i % 64);
            let byte = &mut b.qs[chunk * 32 + rem % 32];
            *byte |= if rem < 32 { q } else { q << 4 };
        }
        b
    }
}

impl QuantBlock for BlockQ4K {
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

    pub(crate) fn sample_block() -> BlockQ4K {
        let mut b: BlockQ4K = Zeroable::zeroed();
        b.d = f32_to_f16(0.5);
        b.dmin = f32_to_f16(0.25);
        for (i, s) in b.scales.iter_mut().enumerate() {
            *s = (i as u8).wrapping_mul(29).wrapping_add(3);
        }
        for (i, q) in b.qs.iter_mut().enumerate() {
            *q = (i as u8).wrapping_mul(37);
        }
        b
    }

    #[test]
    fn quantize_round_trips_within_a_step() {
        let mut state = 7u64;
        for case in 0..200 {
            let spread = [1e-3f32, 0.05, 1.0, 30.0][case % 4];
            let offset = [0.0f32, 0.5, -0.5, 2.0][(case / 4) % 4] * spread;
            let x: Vec<f32> = (0..256)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * spread + offset
                })
                .collect();
            let b = BlockQ4K::quantize(&x);
            let mut y = [0.0; 256];
            b.dequantize(&mut y);
            for (sb, (xs, ys)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
                let lo = xs.iter().cloned().fold(0.0f32, f32::min);
                let hi = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                // Half a step, plus the 6-bit rounding of the scale and min.
                let tol = (hi - lo) / 15.0 * 0.5 + amax / 63.0 * 1.01 + 1e-6;
                for (a, b) in xs.iter().zip(ys) {
                    assert!(
                        (a - b).abs() <= tol,
                        "case {case} sub-block {sb}: {a} -> {b} (tol {tol})"
                    );
                }
            }
        }
        // All zeros stay zeros.
        let mut y = [1.0; 256];
        BlockQ4K::quantize(&[0.0; 256]).dequantize(&mut y);
        assert!(y.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn scale_unpacking_matches_ggml_layout() {
        let mut b: BlockQ4K = Zeroable::zeroed();
        b.scales[0] = 0b1100_0101; // sc0 = 5, top bits 3 go to sc4
        b.scales[4] = 0b0100_0010; // m0 = 2, top bits 1 go to m4
        b.scales[8] = 0x9A; // low nibble -> sc4 low, high nibble -> m4 low
        assert_eq!(scale_min_k4(0, &b.scales), (5, 2));
        assert_eq!(scale_min_k4(4, &b.scales), (0xA | (3 << 4), 0x9 | (1 << 4)));
    }

    #[test]
    fn hand_built_block_dequantizes() {
        let mut b: BlockQ4K = Zeroable::zeroed();
        b.d = f32_to_f16(1.0);
        b.dmin = f32_to_f16(1.0);
        b.scales[0] = 2; // sub-block 0: sc 2
        b.scales[1] = 3; // sub-block 1: sc 3
        b.scales[4] = 1; // sub-block 0: m 1
        b.qs[0] = 0x71; // element 0 -> 1, element 32 -> 7
        let mut out = [0.0; 256];
        b.dequantize(&mut out);
        assert_eq!(out[0], 2.0 - 1.0);
        assert_eq!(out[32], 21.0);
        assert_eq!(out[1], -1.0);
        assert_eq!(out[64], 0.0);
    }

    #[test]
    fn dot_matches_dequantized() {
        let b = sample_block();
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 13) % 31) as f32 / 7.0 - 2.0)
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
        let got = BlockQ4K::vec_dot_ref(&[b], &a);
        assert!(
            (got - want).abs() < 1e-2 * want.abs().max(1.0),
            "{got} vs {want}"
        );
    }
}
