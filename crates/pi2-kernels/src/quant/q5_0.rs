//! Q5_0: 32 weights as 5-bit unsigned `q` with one f16 scale; `w = (q - 16) * d`.
//! The low four bits are packed as in Q4_0 (byte `j` of `qs`: element `j` low nibble, element
//! `j + 16` high nibble); bit `k` of the little-endian `qh` is the fifth bit of element `k`.
//! llama.cpp writes it where a row is not a multiple of 256 (so no k-quant fits), which makes
//! it the bulk of many small models' Q4_K_M files.

use super::{f16_to_f32, f32_to_f16, BlockQ8, QuantBlock, QK};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_0 {
    pub d: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

/// The 32 five-bit values of a Q5 block (`qh`, `qs` as stored), element order.
#[inline]
pub(crate) fn unpack5(qh: [u8; 4], qs: &[u8; QK / 2]) -> [u8; QK] {
    let h = u32::from_le_bytes(qh);
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        q[j] = (qs[j] & 0x0F) | ((((h >> j) & 1) as u8) << 4);
        q[j + QK / 2] = (qs[j] >> 4) | ((((h >> (j + QK / 2)) & 1) as u8) << 4);
    }
    q
}

/// Packs 32 five-bit values (element order) into `(qh, qs)`.
pub(crate) fn pack5(q: &[u8; QK]) -> ([u8; 4], [u8; QK / 2]) {
    let mut qs = [0u8; QK / 2];
    let mut h = 0u32;
    for j in 0..QK / 2 {
        qs[j] = (q[j] & 0x0F) | ((q[j + QK / 2] & 0x0F) << 4);
        h |= ((q[j] as u32 >> 4) & 1) << j;
        h |= ((q[j + QK / 2] as u32 >> 4) & 1) << (j + QK / 2);
    }
    (h.to_le_bytes(), qs)
}

impl BlockQ5_0 {
    /// Reference quantizer (ggml's rounding: scale from the signed extreme, `d = max / -16`).
    pub fn quantize(x: &[f32]) -> Self {
        assert_eq!(x.len(), QK);
        let mut max = 0.0f32;
        for &v in x {
            if v.abs() > max.abs() {
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; QK];
        for (o, &v) in q.iter_mut().zip(x) {
            *o = ((v * id + 16.5) as i32).clamp(0, 31) as u8;
        }
        let (qh, qs) = pack5(&q);
        Self {
            d: f32_to_f16(d),
            qh,
            qs,
        }
    }

    /// The 32 unsigned five-bit values.
    pub fn values(&self) -> [u8; QK] {
        unpack5(self.qh, &self.qs)
    }
}

impl QuantBlock for BlockQ5_0 {
    const LEN: usize = QK;
    type Act = BlockQ8;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (o, q) in out.iter_mut().zip(self.values()) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }

    fn vec_dot_ref(w: &[Self], x: &[BlockQ8]) -> f32 {
        let mut sum = 0.0f32;
        for (wb, xb) in w.iter().zip(x) {
            let isum: i32 = wb
                .values()
                .iter()
                .zip(&xb.qs)
                .map(|(&q, &y)| (q as i32 - 16) * y as i32)
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
        // element 0 = 31 (nibble 15, fifth bit set), element 16 = 3, element 17 = 16 + 1,
        // element 5 = 0 (fifth bit clear, nibble 0).
        let mut b = BlockQ5_0 {
            d: f32_to_f16(0.5),
            qh: [0; 4],
            qs: [0; 16],
        };
        b.qs[0] = 0x3F;
        b.qs[1] = 0x10;
        b.qh = (1u32 | (1 << 17)).to_le_bytes();
        let mut out = [0.0; 32];
        b.dequantize(&mut out);
        assert_eq!(out[0], 7.5); // (31 - 16) * 0.5
        assert_eq!(out[16], -6.5); // (3 - 16) * 0.5
        assert_eq!(out[17], 0.5); // (17 - 16) * 0.5
        assert_eq!(out[5], -8.0); // (0 - 16) * 0.5
    }

    #[test]
    fn pack_unpack_round_trip() {
        let q: [u8; 32] = std::array::from_fn(|i| (i as u8 * 7 + 3) % 32);
        let (qh, qs) = pack5(&q);
        assert_eq!(unpack5(qh, &qs), q);
    }

    #[test]
    fn quantize_round_trip() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 * 0.9).sin() * 3.0).collect();
        let b = BlockQ5_0::quantize(&x);
        let mut y = [0.0; 32];
        b.dequantize(&mut y);
        // Half a step, except a value at the opposite extreme of the signed one, which ggml's
        // rounding clamps one step short (31 instead of 32).
        let d = f16_to_f32(b.d).abs();
        for (a, c) in x.iter().zip(&y) {
            assert!((a - c).abs() <= d * 1.01 + 1e-3, "{a} vs {c}");
        }
    }

    #[test]
    fn dot_matches_dequantized() {
        let q: [u8; 32] = std::array::from_fn(|i| (i as u8 * 13 + 5) % 32);
        let (qh, qs) = pack5(&q);
        let b = BlockQ5_0 {
            d: f32_to_f16(0.25),
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
        assert!((BlockQ5_0::vec_dot_ref(&[b], &a) - want).abs() < 1e-3);
    }
}
