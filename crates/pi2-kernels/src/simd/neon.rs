//! aarch64 kernels: plain NEON (widening multiplies, every ARMv8 core) and the dotprod tier
//! (ARMv8.2 `sdot`, emitted through `asm!` because the Rust dotprod intrinsics are unstable).
//! Both share one generic body; the const `DOT` picks the integer product.

use super::{KernelSet, RowKernels, Tier};
use crate::quant::{self, BlockQ4_0, BlockQ4_1, BlockQ8, BlockQ8_0};
use std::arch::aarch64::*;

pub(super) fn kernel_set(dot: bool) -> KernelSet {
    macro_rules! rk {
        ($b:ty) => {
            if dot {
                RowKernels::<$b> {
                    dot: |w, x| unsafe { rows_dot::<$b, 1>([w], x)[0] },
                    dot4: |w, x| unsafe { rows_dot::<$b, 4>(w, x) },
                }
            } else {
                RowKernels::<$b> {
                    dot: |w, x| unsafe { rows_neon::<$b, 1>([w], x)[0] },
                    dot4: |w, x| unsafe { rows_neon::<$b, 4>(w, x) },
                }
            }
        };
    }
    KernelSet {
        tier: if dot { Tier::Dotprod } else { Tier::Neon },
        f32: |w, x| unsafe { dot_f32(w, x) },
        // f16 vector types are unstable in Rust: the value cache uses the scalar reference.
        f16: quant::f16::vec_dot_ref,
        axpy_f16: quant::f16::axpy_ref,
        q4_0: rk!(BlockQ4_0),
        q4_1: rk!(BlockQ4_1),
        q8_0: rk!(BlockQ8_0),
        q4_k: RowKernels::reference(),
        q5_k: RowKernels::reference(),
        q6_k: RowKernels::reference(),
    }
}

/// `acc += a . b` in four i32 lanes (each lane sums 4 byte products).
#[inline(always)]
unsafe fn idot<const DOT: bool>(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    if DOT {
        let mut acc = acc;
        std::arch::asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
        acc
    } else {
        let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let hi = vmull_high_s8(a, b);
        vpadalq_s16(vpadalq_s16(acc, lo), hi)
    }
}

/// A 32-element weight block as the NEON kernels see it: two 16-byte halves of signed values.
trait Block32: Copy {
    unsafe fn halves(&self) -> (int8x16_t, int8x16_t);
    fn scale(&self) -> f32;
    fn min_term(&self, x: &BlockQ8) -> f32;
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
    fn min_term(&self, _: &BlockQ8) -> f32 {
        0.0
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
    fn min_term(&self, x: &BlockQ8) -> f32 {
        quant::f16_to_f32(self.m) * x.s
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
    fn min_term(&self, _: &BlockQ8) -> f32 {
        0.0
    }
}

#[inline(always)]
unsafe fn rows_body<B: Block32, const R: usize, const DOT: bool>(
    w: [&[B]; R],
    x: &[BlockQ8],
) -> [f32; R] {
    let n = w.iter().map(|r| r.len()).min().unwrap_or(0).min(x.len());
    let mut acc = [vdupq_n_f32(0.0); R];
    let mut mins = [0.0f32; R];
    for i in 0..n {
        let xb = x.get_unchecked(i);
        let (y0, y1) = (vld1q_s8(xb.qs.as_ptr()), vld1q_s8(xb.qs.as_ptr().add(16)));
        for r in 0..R {
            let wb = w[r].get_unchecked(i);
            let (a0, a1) = wb.halves();
            let s = idot::<DOT>(idot::<DOT>(vdupq_n_s32(0), a0, y0), a1, y1);
            acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(s), wb.scale() * xb.d);
            mins[r] += wb.min_term(xb);
        }
    }
    let mut out = [0.0; R];
    for r in 0..R {
        out[r] = vaddvq_f32(acc[r]) + mins[r];
    }
    out
}

/// # Safety
/// NEON is part of every aarch64 target Rust supports.
#[target_feature(enable = "neon")]
unsafe fn rows_neon<B: Block32, const R: usize>(w: [&[B]; R], x: &[BlockQ8]) -> [f32; R] {
    rows_body::<B, R, false>(w, x)
}

/// # Safety
/// The CPU must support the dotprod extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn rows_dot<B: Block32, const R: usize>(w: [&[B]; R], x: &[BlockQ8]) -> [f32; R] {
    rows_body::<B, R, true>(w, x)
}

/// # Safety
/// NEON is part of every aarch64 target Rust supports.
#[target_feature(enable = "neon")]
unsafe fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let (mut a0, mut a1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    let mut i = 0;
    while i + 8 <= n {
        a0 = vfmaq_f32(
            a0,
            vld1q_f32(w.as_ptr().add(i)),
            vld1q_f32(x.as_ptr().add(i)),
        );
        a1 = vfmaq_f32(
            a1,
            vld1q_f32(w.as_ptr().add(i + 4)),
            vld1q_f32(x.as_ptr().add(i + 4)),
        );
        i += 8;
    }
    let mut s = vaddvq_f32(vaddq_f32(a0, a1));
    while i < n {
        s += w[i] * x[i];
        i += 1;
    }
    s
}
