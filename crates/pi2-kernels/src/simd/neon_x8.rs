//! aarch64 kernels over row-interleaved groups (`crate::packed`). Each 32-byte load of a group
//! is two 128-bit vectors, rows 0-3 and rows 4-7, and 32-bit lane `r` holds four quants of row
//! `r`: exactly what `sdot` consumes (dotprod tier). Plain NEON gets the same lane sums from
//! widening multiplies and two pairwise adds. One broadcast of four activations serves all
//! eight rows; the eight f16 scales convert with two `fcvtl`.
//!
//! # Safety
//! Every `unsafe fn` here executes NEON (and, for the dotprod tier, `sdot`) instructions:
//! call it only on a CPU with the features its `#[target_feature]` entry point enables (a
//! `KernelSet` of a tier hands these out only after `Tier::is_supported`). Slices are read
//! within their bounds; raw pointers point into blocks the caller passed, at offsets the block
//! layout defines.

use super::arm::{bcast4, f16x8, lane_dot};
use crate::packed::{group_layout, GroupLayout, GROUP_ROWS};
use crate::quant::BlockQ8;
use crate::QuantType;
use std::arch::aarch64::*;

/// 0x10 in every byte whose bit `k` is set in the packed `qh` bytes.
#[inline(always)]
unsafe fn fifth(h: uint8x16_t, k: i8) -> uint8x16_t {
    vandq_u8(vshlq_u8(h, vdupq_n_s8(4 - k)), vdupq_n_u8(0x10))
}

/// Integer dot products of the group's rows with `T` tokens' blocks: `acc[t] = (rows 0-3,
/// rows 4-7)`.
#[inline(always)]
unsafe fn idot<const DOT: bool, const T: usize>(
    ty: QuantType,
    grp: *const u8,
    l: &GroupLayout,
    y: [*const i8; T],
    acc: &mut [[int32x4_t; 2]; T],
) {
    if ty == QuantType::Q8_0 {
        for j in 0..8 {
            let w = [
                vld1q_s8(grp.add(l.qs + 32 * j) as *const i8),
                vld1q_s8(grp.add(l.qs + 32 * j + 16) as *const i8),
            ];
            for t in 0..T {
                let x = bcast4(y[t], 4 * j);
                for h in 0..2 {
                    acc[t][h] = lane_dot::<DOT>(acc[t][h], w[h], x);
                }
            }
        }
        return;
    }
    let low4 = vdupq_n_u8(0x0F);
    let qh =
        l.qh.map(|at| [vld1q_u8(grp.add(at)), vld1q_u8(grp.add(at + 16))]);
    for j in 0..4 {
        let v = [
            vld1q_u8(grp.add(l.qs + 32 * j)),
            vld1q_u8(grp.add(l.qs + 32 * j + 16)),
        ];
        let mut lo = [vandq_u8(v[0], low4), vandq_u8(v[1], low4)];
        let mut hi = [vshrq_n_u8(v[0], 4), vshrq_n_u8(v[1], 4)];
        if let Some(h) = qh {
            for half in 0..2 {
                lo[half] = vorrq_u8(lo[half], fifth(h[half], j as i8));
                hi[half] = vorrq_u8(hi[half], fifth(h[half], 4 + j as i8));
            }
        }
        for t in 0..T {
            let (xl, xh) = (bcast4(y[t], 4 * j), bcast4(y[t], 16 + 4 * j));
            for h in 0..2 {
                let a = lane_dot::<DOT>(acc[t][h], vreinterpretq_s8_u8(lo[h]), xl);
                acc[t][h] = lane_dot::<DOT>(a, vreinterpretq_s8_u8(hi[h]), xh);
            }
        }
    }
}

/// Quants subtracted from every weight (Q4_0: 8, Q5_0: 16), taken out as `offset * sum(y)`.
fn offset(ty: QuantType) -> i32 {
    match ty {
        QuantType::Q4_0 => 8,
        QuantType::Q5_0 => 16,
        _ => 0,
    }
}

#[inline(always)]
unsafe fn rows8_body<const DOT: bool, const T: usize>(
    ty: QuantType,
    groups: &[u8],
    x: [&[BlockQ8]; T],
    sums: [&[i32]; T],
) -> [[float32x4_t; 2]; T] {
    let l = group_layout(ty).expect("packable type");
    let off = offset(ty);
    let nb = groups.len() / l.bytes;
    for t in 0..T {
        assert!(x[t].len() >= nb && (off == 0 || sums[t].len() >= nb));
    }
    let mut acc = [[vdupq_n_f32(0.0); 2]; T];
    for b in 0..nb {
        let grp = groups.as_ptr().add(b * l.bytes);
        let y: [*const i8; T] = std::array::from_fn(|t| x[t].get_unchecked(b).qs.as_ptr());
        let mut isum = [[vdupq_n_s32(0); 2]; T];
        idot::<DOT, T>(ty, grp, &l, y, &mut isum);
        let dw = f16x8(grp);
        let mw = l.min.map(|at| f16x8(grp.add(at)));
        for t in 0..T {
            let xb = x[t].get_unchecked(b);
            let o = vdupq_n_s32(off * *sums[t].get_unchecked(b));
            for (h, d) in [dw.0, dw.1].into_iter().enumerate() {
                // `crate::quant::term`'s steps, lane by lane: the reference's rounding.
                let i = vsubq_s32(isum[t][h], o);
                let mut term = vmulq_f32(vmulq_n_f32(d, xb.d), vcvtq_f32_s32(i));
                if let Some(m) = mw {
                    let m = if h == 0 { m.0 } else { m.1 };
                    term = vaddq_f32(term, vmulq_n_f32(m, xb.s));
                }
                acc[t][h] = vaddq_f32(acc[t][h], term);
            }
        }
    }
    acc
}

#[inline(always)]
unsafe fn rows8_n<const DOT: bool>(
    ty: QuantType,
    g: &[u8],
    x: [&[BlockQ8]; 4],
    s: [&[i32]; 4],
    n: usize,
    out: &mut [[f32; GROUP_ROWS]; 4],
) {
    macro_rules! run {
        ($t:literal) => {{
            let acc = rows8_body::<DOT, $t>(
                ty,
                g,
                std::array::from_fn(|i| x[i]),
                std::array::from_fn(|i| s[i]),
            );
            for (o, a) in out.iter_mut().zip(acc) {
                vst1q_f32(o.as_mut_ptr(), a[0]);
                vst1q_f32(o.as_mut_ptr().add(4), a[1]);
            }
        }};
    }
    match n {
        1 => run!(1),
        2 => run!(2),
        3 => run!(3),
        _ => run!(4),
    }
}

/// # Safety
/// NEON is part of every aarch64 target Rust supports.
#[target_feature(enable = "neon")]
unsafe fn rows8_neon<const TY: u32>(
    g: &[u8],
    x: [&[BlockQ8]; 4],
    s: [&[i32]; 4],
    n: usize,
    out: &mut [[f32; GROUP_ROWS]; 4],
) {
    let ty = QuantType::from_ggml_id(TY).expect("packable type id");
    rows8_n::<false>(ty, g, x, s, n, out)
}

/// # Safety
/// The CPU must support the dotprod extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn rows8_dot<const TY: u32>(
    g: &[u8],
    x: [&[BlockQ8]; 4],
    s: [&[i32]; 4],
    n: usize,
    out: &mut [[f32; GROUP_ROWS]; 4],
) {
    let ty = QuantType::from_ggml_id(TY).expect("packable type id");
    rows8_n::<true>(ty, g, x, s, n, out)
}

/// The interleaved kernels, with `sdot` if `dot`.
pub(super) fn x8_kernels(dot: bool) -> super::X8Kernels {
    macro_rules! k {
        ($id:literal) => {
            if dot {
                |g, x, s, n, out| unsafe { rows8_dot::<$id>(g, x, s, n, out) }
            } else {
                |g, x, s, n, out| unsafe { rows8_neon::<$id>(g, x, s, n, out) }
            }
        };
    }
    super::X8Kernels {
        q4_0: k!(2),
        q4_1: k!(3),
        q5_0: k!(6),
        q5_1: k!(7),
        q8_0: k!(8),
        q4_k: super::neon_x8k::rows8k::<12>(dot),
        q5_k: super::neon_x8k::rows8k::<13>(dot),
        q6_k: super::neon_x8k::rows8k::<14>(dot),
        fast: true,
    }
}
