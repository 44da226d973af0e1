//! aarch64 kernels: plain NEON (widening multiplies, every ARMv8 core) and the dotprod tier
//! (ARMv8.2 `sdot`, emitted through `asm!` because the Rust dotprod intrinsics are unstable).
//! Both share one generic body; the const `DOT` picks the integer product.
//!
//! # Safety
//! Every `unsafe fn` here executes NEON (and, for the dotprod tier, `sdot`) instructions:
//! call it only on a CPU with the features its `#[target_feature]` entry point enables (a
//! `KernelSet` of a tier hands these out only after `Tier::is_supported`). Slices are read
//! within their bounds; raw pointers point into blocks the caller passed, at offsets the block
//! layout defines.

use super::arm::idot;
use super::{KernelSet, RowKernels, Tier};
use crate::quant::{
    self, BlockIQ4NL, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8, BlockQ8_0,
};
use std::arch::aarch64::*;

pub(super) fn kernel_set(dot: bool) -> KernelSet {
    KernelSet {
        tier: if dot { Tier::Dotprod } else { Tier::Neon },
        f32: |w, x| unsafe { dot_f32(w, x) },
        // f16 vector types are unstable in Rust: the value cache uses the scalar reference.
        f16: quant::f16::vec_dot_ref,
        axpy_f16: quant::f16::axpy_ref,
        bf16: |w, x| unsafe { dot_bf16(w, x) },
        axpy_bf16: |a, x, y| unsafe { axpy_bf16(a, x, y) },
        q4_0: tiles::<BlockQ4_0>(dot),
        iq4_nl: tiles::<BlockIQ4NL>(dot),
        iq4_xs: super::neon_k::rows(dot),
        q2_k: super::neon_k::rows(dot),
        q3_k: super::neon_k::rows(dot),
        mxfp4: RowKernels::reference(),
        q4_1: tiles::<BlockQ4_1>(dot),
        q5_0: tiles::<BlockQ5_0>(dot),
        q5_1: tiles::<BlockQ5_1>(dot),
        q8_0: tiles::<BlockQ8_0>(dot),
        q4_k: super::neon_k::rows(dot),
        q5_k: super::neon_k::rows(dot),
        q6_k: super::neon_k::rows(dot),
        x8: super::neon_x8::x8_kernels(dot),
    }
}

/// The row kernels of a 32-element block type, all from the one `tile_body`.
fn tiles<B: Block32 + crate::quant::QuantBlock<Act = BlockQ8>>(dot: bool) -> RowKernels<B> {
    if dot {
        RowKernels {
            dot: |w, x| unsafe { tile_dot::<B, 1, 1>([w], [x])[0][0] },
            dot4: |w, x| unsafe { tile_dot::<B, 4, 1>(w, [x]).map(|r| r[0]) },
            dot4x2: |w, x| unsafe { tile_dot::<B, 4, 2>(w, x) },
            axpy: |w, a, y| unsafe { axpy::<B>(w, a, y) },
        }
    } else {
        RowKernels {
            dot: |w, x| unsafe { tile_neon::<B, 1, 1>([w], [x])[0][0] },
            dot4: |w, x| unsafe { tile_neon::<B, 4, 1>(w, [x]).map(|r| r[0]) },
            dot4x2: |w, x| unsafe { tile_neon::<B, 4, 2>(w, x) },
            axpy: |w, a, y| unsafe { axpy::<B>(w, a, y) },
        }
    }
}

/// A 32-element weight block as the NEON kernels see it: two 16-byte halves of signed values.
trait Block32: Copy {
    unsafe fn halves(&self) -> (int8x16_t, int8x16_t);
    fn scale(&self) -> f32;
    /// The min (Q4_1, Q5_1: `w = q * d + m`), `None` for symmetric formats.
    fn min(&self) -> Option<f32> {
        None
    }
    /// This block's share of a row's dot product from its exact integer sum with `x`: the
    /// formula of `crate::quant::term` every tier uses.
    #[inline(always)]
    fn term(&self, x: &BlockQ8, isum: i32) -> f32 {
        match self.min() {
            Some(m) => quant::term::with_min(self.scale(), x.d, isum, m, x.s),
            None => quant::term::scaled(self.scale(), x.d, isum),
        }
    }
}

impl Block32 for BlockQ4_0 {
    #[inline(always)]
    unsafe fn halves(&self) -> (int8x16_t, int8x16_t) {
        let q = vld1q_u8(self.qs.as_ptr());
        let eight = vdupq_n_s8(8);
        (
            vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))), eight),
            vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), eight),
        )
    }
    fn scale(&self) -> f32 {
        quant::f16_to_f32(self.d)
    }
}

impl Block32 for BlockIQ4NL {
    #[inline(always)]
    unsafe fn halves(&self) -> (int8x16_t, int8x16_t) {
        let q = vld1q_u8(self.qs.as_ptr());
        let table = vld1q_s8(quant::iq4_nl::IQ4NL_TABLE.as_ptr());
        (
            vqtbl1q_s8(table, vandq_u8(q, vdupq_n_u8(0x0F))),
            vqtbl1q_s8(table, vshrq_n_u8(q, 4)),
        )
    }
    fn scale(&self) -> f32 {
        quant::f16_to_f32(self.d)
    }
}

impl Block32 for BlockQ4_1 {
    #[inline(always)]
    unsafe fn halves(&self) -> (int8x16_t, int8x16_t) {
        let q = vld1q_u8(self.qs.as_ptr());
        (
            vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))),
            vreinterpretq_s8_u8(vshrq_n_u8(q, 4)),
        )
    }
    fn scale(&self) -> f32 {
        quant::f16_to_f32(self.d)
    }
    fn min(&self) -> Option<f32> {
        Some(quant::f16_to_f32(self.m))
    }
}

/// The fifth bits of a Q5 block as 0x10 per element: elements 0..16, then 16..32.
#[inline(always)]
unsafe fn fifth_bits(qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let bit = vld1q_u8(BIT.as_ptr());
    let half = |b0: u8, b1: u8| {
        let bytes = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
        vandq_u8(vtstq_u8(bytes, bit), vdupq_n_u8(0x10))
    };
    (half(qh[0], qh[1]), half(qh[2], qh[3]))
}

/// The 32 five-bit values of a Q5 block as two halves of unsigned bytes.
#[inline(always)]
unsafe fn fives(qh: [u8; 4], qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    let q = vld1q_u8(qs.as_ptr());
    let (h0, h1) = fifth_bits(qh);
    (
        vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0F)), h0),
        vorrq_u8(vshrq_n_u8(q, 4), h1),
    )
}

impl Block32 for BlockQ5_0 {
    #[inline(always)]
    unsafe fn halves(&self) -> (int8x16_t, int8x16_t) {
        let (a, b) = fives(self.qh, &self.qs);
        let sixteen = vdupq_n_s8(16);
        (
            vsubq_s8(vreinterpretq_s8_u8(a), sixteen),
            vsubq_s8(vreinterpretq_s8_u8(b), sixteen),
        )
    }
    fn scale(&self) -> f32 {
        quant::f16_to_f32(self.d)
    }
}

impl Block32 for BlockQ5_1 {
    #[inline(always)]
    unsafe fn halves(&self) -> (int8x16_t, int8x16_t) {
        let (a, b) = fives(self.qh, &self.qs);
        (vreinterpretq_s8_u8(a), vreinterpretq_s8_u8(b))
    }
    fn scale(&self) -> f32 {
        quant::f16_to_f32(self.d)
    }
    fn min(&self) -> Option<f32> {
        Some(quant::f16_to_f32(self.m))
    }
}

impl Block32 for BlockQ8_0 {
    #[inline(always)]
    unsafe fn halves(&self) -> (int8x16_t, int8x16_t) {
        (
            vld1q_s8(self.qs.as_ptr()),
            vld1q_s8(self.qs.as_ptr().add(16)),
        )
    }
    fn scale(&self) -> f32 {
        quant::f16_to_f32(self.d)
    }
}

/// `y += a * row`: each half widens i8 -> i16 -> i32 -> f32, is dequantized as the format's
/// `dequantize` does (`q * d`, plus the min) and added as `y + a * w` (no fused multiply-add:
/// the reference's rounding on every tier).
unsafe fn axpy<B: Block32>(w: &[B], a: f32, y: &mut [f32]) {
    assert!(y.len() >= w.len() * 32, "axpy: output shorter than the row");
    let av = vdupq_n_f32(a);
    for (bi, b) in w.iter().enumerate() {
        let (h0, h1) = b.halves();
        let (d, min) = (b.scale(), b.min().map(|m| vdupq_n_f32(m)));
        let yp = y.as_mut_ptr().add(bi * 32);
        for (k, h) in [h0, h1].into_iter().enumerate() {
            let w16 = [vmovl_s8(vget_low_s8(h)), vmovl_high_s8(h)];
            for (j, v16) in w16.into_iter().enumerate() {
                for (i, v32) in [vmovl_s16(vget_low_s16(v16)), vmovl_high_s16(v16)]
                    .into_iter()
                    .enumerate()
                {
                    let p = yp.add(k * 16 + j * 8 + i * 4);
                    let mut v = vmulq_n_f32(vcvtq_f32_s32(v32), d);
                    if let Some(m) = min {
                        v = vaddq_f32(v, m);
                    }
                    vst1q_f32(p, vaddq_f32(vld1q_f32(p), vmulq_f32(av, v)));
                }
            }
        }
    }
}

/// `R` rows against `T` activation rows; each weight block is unpacked once per tile. Each
/// (row, token) block's integer sum is made exact and added as the block's `term`, in block
/// order: the scalar reference's value, bit for bit.
#[inline(always)]
unsafe fn tile_body<B: Block32, const R: usize, const T: usize, const DOT: bool>(
    w: [&[B]; R],
    x: [&[BlockQ8]; T],
) -> [[f32; T]; R] {
    let n = w
        .iter()
        .map(|r| r.len())
        .chain(x.iter().map(|r| r.len()))
        .min()
        .unwrap_or(0);
    let mut out = [[0.0f32; T]; R];
    for i in 0..n {
        let mut y = [(vdupq_n_s8(0), vdupq_n_s8(0)); T];
        for t in 0..T {
            let q = x[t].get_unchecked(i).qs.as_ptr();
            y[t] = (vld1q_s8(q), vld1q_s8(q.add(16)));
        }
        for r in 0..R {
            let wb = w[r].get_unchecked(i);
            let (a0, a1) = wb.halves();
            for t in 0..T {
                let xb = x[t].get_unchecked(i);
                let s = idot::<DOT>(idot::<DOT>(vdupq_n_s32(0), a0, y[t].0), a1, y[t].1);
                out[r][t] += wb.term(xb, vaddvq_s32(s));
            }
        }
    }
    out
}

/// # Safety
/// NEON is part of every aarch64 target Rust supports.
#[target_feature(enable = "neon")]
unsafe fn tile_neon<B: Block32, const R: usize, const T: usize>(
    w: [&[B]; R],
    x: [&[BlockQ8]; T],
) -> [[f32; T]; R] {
    tile_body::<B, R, T, false>(w, x)
}

/// # Safety
/// The CPU must support the dotprod extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn tile_dot<B: Block32, const R: usize, const T: usize>(
    w: [&[B]; R],
    x: [&[BlockQ8]; T],
) -> [[f32; T]; R] {
    tile_body::<B, R, T, true>(w, x)
}

/// Four BF16 values at `p` as f32 (a widening shift: exact).
///
/// # Safety
/// NEON; four `u16` readable at `p`.
#[target_feature(enable = "neon")]
unsafe fn load_bf16x4(p: *const u16) -> float32x4_t {
    vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p)))
}

/// A float dot product in the canonical order (`crate::quant::float_order`): lanes 0..16 of each
/// 16-element chunk in four registers, multiply then add, folded as the reference folds them.
///
/// # Safety
/// NEON; `load(i)` reads 4 values at element `i`.
#[inline(always)]
unsafe fn dot_canonical(n: usize, load: impl Fn(usize) -> float32x4_t, x: &[f32]) -> f32 {
    let mut a = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (k, acc) in a.iter_mut().enumerate() {
            let p = vmulq_f32(load(i + 4 * k), vld1q_f32(x.as_ptr().add(i + 4 * k)));
            *acc = vaddq_f32(*acc, p);
        }
        i += 16;
    }
    // lane j + lane j + 8, then j + j + 4, then (0 + 2) + (1 + 3)
    let u = vaddq_f32(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]));
    let v = vadd_f32(vget_low_f32(u), vget_high_f32(u));
    vget_lane_f32::<0>(v) + vget_lane_f32::<1>(v)
}

/// # Safety
/// NEON is part of every aarch64 target Rust supports.
#[target_feature(enable = "neon")]
unsafe fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let mut s = dot_canonical(n, |i| load_bf16x4(w.as_ptr().add(i)), x);
    for i in n / 16 * 16..n {
        s += quant::bf16::bf16_to_f32(w[i]) * x[i];
    }
    s
}

/// # Safety
/// NEON is part of every aarch64 target Rust supports.
#[target_feature(enable = "neon")]
unsafe fn axpy_bf16(a: f32, x: &[u16], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let av = vdupq_n_f32(a);
    let mut i = 0;
    while i + 4 <= n {
        let yp = y.as_mut_ptr().add(i);
        let p = vmulq_f32(av, load_bf16x4(x.as_ptr().add(i)));
        vst1q_f32(yp, vaddq_f32(vld1q_f32(yp), p));
        i += 4;
    }
    while i < n {
        y[i] += a * quant::bf16::bf16_to_f32(x[i]);
        i += 1;
    }
}

/// # Safety
/// NEON is part of every aarch64 target Rust supports.
#[target_feature(enable = "neon")]
unsafe fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let mut s = dot_canonical(n, |i| vld1q_f32(w.as_ptr().add(i)), x);
    for i in n / 16 * 16..n {
        s += w[i] * x[i];
    }
    s
}
