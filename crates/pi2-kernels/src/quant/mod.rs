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

/// The one order every tier sums a float dot product in, so that a file's answer does not
/// depend on the CPU: lane `j` of [`LANES`] accumulates the products `i = j (mod LANES)` of the
/// whole chunks (a multiply, then an add: no fused multiply-add, which not every tier has), the
/// lanes fold in halves ([`fold_lanes`]), and the tail adds on in order.
pub mod float_order {
    /// Lanes of the canonical sum: AVX2 holds them in two registers, AVX-512 in one, NEON in four.
    pub const LANES: usize = 16;

    /// `((l0 + l8) + (l4 + l12)) ...`: lane `j` and lane `j + half` added, halving to one value.
    #[inline]
    pub fn fold_lanes(a: [f32; LANES]) -> f32 {
        let t: [f32; 8] = std::array::from_fn(|j| a[j] + a[j + 8]);
        let u: [f32; 4] = std::array::from_fn(|j| t[j] + t[j + 4]);
        (u[0] + u[2]) + (u[1] + u[3])
    }

    /// `sum(w(i) * x[i])` over `n` elements in the canonical order.
    #[inline]
    pub fn dot(n: usize, w: impl Fn(usize) -> f32, x: &[f32]) -> f32 {
        let whole = n / LANES * LANES;
        let mut lanes = [0.0f32; LANES];
        for chunk in (0..whole).step_by(LANES) {
            for (j, lane) in lanes.iter_mut().enumerate() {
                *lane += w(chunk + j) * x[chunk + j];
            }
        }
        let tail = x[whole..n].iter().enumerate();
        tail.fold(fold_lanes(lanes), |s, (k, &v)| s + w(whole + k) * v)
    }
}

/// How one block's exact integer sums become its share of a row's dot product: every tier's
/// kernels call these with the same integers, and a row adds its blocks' shares in block order,
/// so the result is the same on every CPU (the integer sums are exact in any order; only the
/// float steps could differ).
pub mod term {
    /// `dw * dx * isum`: the symmetric formats (and Q6_K, Q3_K, IQ4_XS with their scales folded
    /// into `isum`).
    #[inline(always)]
    pub fn scaled(dw: f32, dx: f32, isum: i32) -> f32 {
        dw * dx * isum as f32
    }

    /// `dw * dx * isum + m * sx`: Q4_1 and Q5_1, `sx` the activation block's `d * sum(q)`.
    #[inline(always)]
    pub fn with_min(dw: f32, dx: f32, isum: i32, m: f32, sx: f32) -> f32 {
        dw * dx * isum as f32 + m * sx
    }

    /// `dx * (d * scaled - dmin * mins)`: Q4_K, Q5_K and Q2_K.
    #[inline(always)]
    pub fn k_min(dx: f32, d: f32, scaled: i32, dmin: f32, mins: i32) -> f32 {
        dx * (d * scaled as f32 - dmin * mins as f32)
    }
}

/// 16-bit float weights (F16, BF16) as their formats' scalar references use them: each value
/// expanded exactly by `expand`, products summed in [`float_order`].
pub(crate) mod half_ref {
    pub fn dot(w: &[u16], x: &[f32], expand: fn(u16) -> f32) -> f32 {
        let n = w.len().min(x.len());
        super::float_order::dot(n, |i| expand(w[i]), x)
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
