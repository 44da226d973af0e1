//! What the aarch64 kernel modules share: the two byte dot products (`sdot` on the dotprod tier,
//! widening multiplies and pairwise adds on plain NEON), an activation broadcast and f16
//! conversion.
//!
//! # Safety
//! Every `unsafe fn` here executes NEON (and, with `DOT`, `sdot`) instructions: call it only
//! from a kernel whose `#[target_feature]` entry point enables them (a `KernelSet` of a tier
//! hands those out only after `Tier::is_supported`). Raw pointers point into blocks the caller
//! passed, at offsets the block layout defines.

use std::arch::aarch64::*;

/// `sdot`: lane `i` of `acc` plus the products of bytes `4i..4i+4` (dotprod CPUs only).
#[inline(always)]
unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    std::arch::asm!(
        "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

/// `acc += a . b` in four i32 lanes (each lane sums 4 byte products).
#[inline(always)]
pub(super) unsafe fn idot<const DOT: bool>(
    acc: int32x4_t,
    a: int8x16_t,
    b: int8x16_t,
) -> int32x4_t {
    if DOT {
        sdot(acc, a, b)
    } else {
        let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let hi = vmull_high_s8(a, b);
        vpadalq_s16(vpadalq_s16(acc, lo), hi)
    }
}

/// `acc + a.b` lane by lane: lane `i` adds the products of bytes `4i..4i+4`.
#[inline(always)]
pub(super) unsafe fn lane_dot<const DOT: bool>(
    acc: int32x4_t,
    a: int8x16_t,
    b: int8x16_t,
) -> int32x4_t {
    if DOT {
        sdot(acc, a, b)
    } else {
        let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let hi = vmull_high_s8(a, b);
        vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)))
    }
}

/// Four activations (bytes `at..at + 4`) in every lane.
#[inline(always)]
pub(super) unsafe fn bcast4(y: *const i8, at: usize) -> int8x16_t {
    vreinterpretq_s8_s32(vdupq_n_s32(std::ptr::read_unaligned(
        y.add(at) as *const i32
    )))
}

/// Eight f16 values as two f32 vectors (`fcvtl`, ARMv8.0; the Rust f16 vector types are
/// unstable).
#[inline(always)]
pub(super) unsafe fn f16x8(p: *const u8) -> (float32x4_t, float32x4_t) {
    let raw = vld1q_u16(p as *const u16);
    let (lo, hi): (float32x4_t, float32x4_t);
    std::arch::asm!(
        "fcvtl {lo:v}.4s, {raw:v}.4h",
        "fcvtl2 {hi:v}.4s, {raw:v}.8h",
        raw = in(vreg) raw,
        lo = out(vreg) lo,
        hi = out(vreg) hi,
        options(pure, nomem, nostack, preserves_flags),
    );
    (lo, hi)
}
