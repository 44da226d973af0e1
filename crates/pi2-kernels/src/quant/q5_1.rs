//! Q5_1: 32 weights as 5-bit unsigned `q` with f16 scale `d` and f16 minimum `m`;
//! `w = q * d + m`. Bits are laid out as in Q5_0. The dot product uses the activation block's
//! `s = d_x * sum(q_x)` for the min term, as Q4_1 does.

use super::q5_0::{pack5, unpack5};
use super::{f16_to_f32, f32_to_f16, BlockQ8, QuantBlock, QK};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_1 {
    pub d: u16,
    pub m: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

impl BlockQ5_1 {
    /// Reference quantizer: `d = (max - min) / 31`, `m = min`.
    pub fn quantize(x: &[f32]) -> Self {
        assert_eq!(x.len(), QK);
        let min = x.iter().cloned().fold(f32::INFINITY, f32::min);
        let max = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; QK];
        for (o, &v) in q.iter_mut().zip(x) {
            *o = (((v - min) * id + 0.5) as i32).clamp(0, 31) as u8;
        }
        let (qh, qs) = pack5(&q);
        Self {
            d: f32_to_f16(d),
            m: f32_to_f16(min),
            qh,
            qs,
        }
    }

    /// The 32 unsigned five-bit values.
    pub fn values(&self) -> [u8; QK] {
        unpack5(self.qh, &self.qs)
    }
}

impl QuantBlock for BlockQ5_1 {
    const LEN: usize = QK;
    type Act = BlockQ8;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (f16_to_f32(self.d), f16_to_f32(self.m));
        for (o, q) in out.iter_mut().zip(self.values()) {
            *o = q as f32 * d + m;
        }
    }

    fn vec_dot_ref(w: &[Self], x: &[BlockQ8]) -> f32 {
        let mut sum = 0.0f32;
        for (wb, xb) in w.iter().zip(x) {
            let isum: i32 = wb
                .values()
                .iter()
                .zip(&xb.qs)
                .map(|(&q, &y)| q as i32 * y as i32)
                .sum();
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
        let mut b = BlockQ5_1 {
            d: f32_to_f16(2.0),
            m: f32_to_f16(-1.0),
            qh: (1u32 << 16).to_le_bytes(),
            qs: [0; 16],
        };
        b.qs[0] = 0x3F; // element 0 -> 15, element 16 -> 3 | 16 = 19
        let mut out = [0.0; 32];
        b.dequantize(&mut out);
        assert_eq!(out[0], 29.0);
        assert_eq!(out[16], 37.0);
        assert_eq!(out[3], -1.0);
    }

    #[test]
    fn quantize_round_trip() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32).sin() * 3.0 + 1.0).collect();
        let b = BlockQ5_1::quantize(&x);
        let mut y = [0.0; 32];
        b.dequantize(&mut y);
        let d = f16_to_f32(b.d);
        for (a, c) in x.iter().zip(&y) {
            assert!((a - c).abs() <= d * 0.51 + 1e-2, "{a} vs {c}");
        }
    }

    #[test]
    fn dot_matches_dequantized() {
        let q: [u8; 32] = std::array::from_fn(|i| (i as u8 * 11 + 2) % 32);
        let (qh, qs) = pack5(&q);
        let b = BlockQ5_1 {
            d: f32_to_f16(0.5),
            m: f32_to_f16(-2.0),
            qh,
            qs,
        };
        let x: Vec<f32> = (0..32).map(|i| (i as f32 * 0.7).cos()).collect();
        let mut a = [BlockQ8::default()];
        super::super::q8_act::quantize_q8(&x, &mut a);
        let (mut w, mut xq) = ([0.0; 32], [0.0; 32]);
        b.dequantize(&mut w);
        a[0].dequantize(&mut xq);
        let want: f32 = w.iter().zip(&xq).map(|(p, q)| p * q).sum();
        assert!((BlockQ5_1::vec_dot_ref(&[b], &a) - want).abs() < 2e-3);
    }
}
