//! MXFP4 (OCP microscaling FP4, gpt-oss's experts): 32 weights as 4-bit E2M1 values, one E8M0
//! power-of-two scale; `w = 2^(e - 128) * TABLE[q]`, the table holding the E2M1 values doubled
//! (ggml's `kvalues_mxfp4` and `ggml_e8m0_to_fp32_half`). Nibble layout as Q4_0: byte `j` holds
//! element `j` in the low nibble and `j + 16` in the high one. Activations are Q8_0 blocks.

use super::{BlockQ8, QuantBlock, QK};
use bytemuck::{Pod, Zeroable};

/// The 16 E2M1 values, doubled.
pub const MXFP4_TABLE: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct BlockMXFP4 {
    pub e: u8,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockMXFP4>() == 17);

/// `2^(e - 128)`: half the E8M0 scale (the table is doubled), exact for every `e` (the two
/// smallest as subnormals).
pub fn e8m0_half(e: u8) -> f32 {
    let bits = match e {
        0 | 1 => 0x0020_0000u32 << e,
        _ => (e as u32 - 1) << 23,
    };
    f32::from_bits(bits)
}

impl BlockMXFP4 {
    /// ggml's reference quantizer: the exponent from the largest magnitude, each weight the
    /// nearest table value (the lower index on a tie).
    pub fn quantize(x: &[f32]) -> Self {
        assert_eq!(x.len(), QK);
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let e = match amax > 0.0 {
            true => (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 255.0) as u8,
            false => 0,
        };
        let d = e8m0_half(e);
        let nearest = |v: f32| {
            let mut best = 0;
            for (i, &t) in MXFP4_TABLE.iter().enumerate() {
                if (t as f32 * d - v).abs() < (MXFP4_TABLE[best] as f32 * d - v).abs() {
                    best = i;
                }
            }
            best as u8
        };
        let mut qs = [0u8; QK / 2];
        for j in 0..QK / 2 {
            qs[j] = nearest(x[j]) | (nearest(x[j + QK / 2]) << 4);
        }
        Self { e, qs }
    }
}

impl QuantBlock for BlockMXFP4 {
    const LEN: usize = QK;
    type Act = BlockQ8;

    fn dequantize(&self, out: &mut [f32]) {
        let d = e8m0_half(self.e);
        for j in 0..QK / 2 {
            out[j] = MXFP4_TABLE[(self.qs[j] & 0x0F) as usize] as f32 * d;
            out[j + QK / 2] = MXFP4_TABLE[(self.qs[j] >> 4) as usize] as f32 * d;
        }
    }

    fn vec_dot_ref(w: &[Self], x: &[BlockQ8]) -> f32 {
        let mut sum = 0.0f32;
        for (wb, xb) in w.iter().zip(x) {
            let mut isum = 0i32;
            for j in 0..QK / 2 {
                isum += MXFP4_TABLE[(wb.qs[j] & 0x0F) as usize] as i32 * xb.qs[j] as i32;
                isum += MXFP4_TABLE[(wb.qs[j] >> 4) as usize] as i32 * xb.qs[j + QK / 2] as i32;
            }
            sum += super::term::scaled(e8m0_half(wb.e), xb.d, isum);
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_are_exact_powers_of_two() {
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(2), 2f32.powi(-126));
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_half(255), 2f32.powi(127));
    }

    #[test]
    fn quantize_keeps_representable_values() {
        // Values on the grid of e = 128 (d = 1): every table value.
        let x: Vec<f32> = (0..32).map(|i| MXFP4_TABLE[i % 16] as f32).collect();
        let b = BlockMXFP4::quantize(&x);
        let mut out = [0.0; 32];
        b.dequantize(&mut out);
        assert_eq!(out.to_vec(), x);
        assert_eq!(BlockMXFP4::quantize(&[0.0; 32]), BlockMXFP4::default());
    }
}
