//! Weight block formats (one module each) and the activation blocks they pair with.
//!
//! Every format is a `#[repr(C)]` block struct whose size is checked at compile time, a
//! `dequantize` and a scalar integer dot product against its activation partner. The scalar
//! code is the specification the SIMD paths in `crate::simd` are tested against.

pub mod bf16;
pub mod f16;
pub mod f32;
pub mod iq4_nl;
pub mod iq4_xs;
pub mod mxfp4;
pub mod q2_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_act;

pub use iq4_nl::BlockIQ4NL;
pub use iq4_xs::BlockIQ4XS;
pub use mxfp4::BlockMXFP4;
pub use q2_k::{BlockQ2K, BlockQ3K};
pub use q4_0::BlockQ4_0;
pub use q4_1::BlockQ4_1;
pub use q4_k::BlockQ4K;
pub use q5_0::BlockQ5_0;
pub use q5_1::BlockQ5_1;
pub use q5_k::BlockQ5K;
pub use q6_k::BlockQ6K;
pub use q8_0::BlockQ8_0;
pub use q8_act::{BlockQ8, BlockQ8K};

/// Elements per block of the 32-wide formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
pub const QK: usize = 32;
/// Elements per super-block of the k-quant formats (Q4_K, Q5_K, Q6_K).
pub const QK_K: usize = 256;
/// Bytes of the packed 6-bit scales/mins of Q4_K and Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// A quantized activation block type ([`BlockQ8`], [`BlockQ8K`]).
pub trait ActBlock: bytemuck::Pod + Sync {
    /// The activation format it belongs to.
    const KIND: crate::ActKind;
}

impl ActBlock for BlockQ8 {
    const KIND: crate::ActKind = crate::ActKind::Q8;
}

impl ActBlock for BlockQ8K {
    const KIND: crate::ActKind = crate::ActKind::Q8K;
}

/// A weight block type: how to expand it and which activation block its dot product consumes.
pub trait QuantBlock: bytemuck::Pod + Sync {
    /// Elements per block.
    const LEN: usize;
    /// The quantized activation block the integer dot product pairs with.
    type Act: ActBlock;
    /// Expand one block into `Self::LEN` floats.
    fn dequantize(&self, out: &mut [f32]);
    /// Scalar reference dot product of a row of blocks with the matching activation blocks.
    fn vec_dot_ref(w: &[Self], x: &[Self::Act]) -> f32;
}

/// 16-bit float weights (F16, BF16) as their formats' scalar references use them: each value
/// expanded exactly by `expand`, products summed in order.
pub(crate) mod half_ref {
    pub fn dot(w: &[u16], x: &[f32], expand: fn(u16) -> f32) -> f32 {
        w.iter().zip(x).map(|(&h, &v)| expand(h) * v).sum()
    }

    pub fn axpy(a: f32, x: &[u16], y: &mut [f32], expand: fn(u16) -> f32) {
        for (o, &h) in y.iter_mut().zip(x) {
            *o += a * expand(h);
        }
    }

    pub fn dequantize(w: &[u16], out: &mut [f32], expand: fn(u16) -> f32) {
        for (o, &h) in out.iter_mut().zip(w) {
            *o = expand(h);
        }
    }
}

#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

#[inline]
pub fn f32_to_f16(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

/// Unpack the 6-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes of Q4_K/Q5_K.
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}
