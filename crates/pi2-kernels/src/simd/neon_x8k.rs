//! aarch64 kernels over interleaved k-quant groups (`crate::packed::kquant`). As in
//! `neon_x8.rs`, a 32-byte load is rows 0-3 and rows 4-7 and lane `r` is row `r`; a
//! sub-block's byte products accumulate exactly per lane (`sdot`, or widening multiplies and
//! pairwise adds) and one multiply-add by the rows' scales finishes it.
//!
//! # Safety
//! Every `unsafe fn` here executes NEON (and, for the dotprod tier, `sdot`) instructions:
//! call it only on a CPU with the features its `#[target_feature]` entry point enables (a
//! `KernelSet` of a tier hands these out only after `Tier::is_supported`). Slices are read
//! within their bounds; raw pointers point into blocks the caller passed, at offsets the block
//! layout defines.

use super::arm::{bcast4, f16x8, lane_dot};
use crate::packed::{bsum32_pairs, group_layout, GroupLayout, GROUP_ROWS};
use crate::quant::BlockQ8K;
use crate::QuantType;
use std::arch::aarch64::*;

/// The rows' two values of a scale (or minimum) pair, 16 bytes at `p`, as i32 lanes:
/// `([first of rows 0-3, rows 4-7], [second ...])`.
#[inline(always)]
unsafe fn pairs(p: *const u8, signed: bool) -> ([int32x4_t; 2], [int32x4_t; 2]) {
    let raw = vld1q_u8(p);
    let halves: [int32x4_t; 2] = if signed {
        let s = vreinterpretq_s8_u8(raw);
        [
            vreinterpretq_s32_s16(vmovl_s8(vget_low_s8(s))),
            vreinterpretq_s32_s16(vmovl_high_s8(s)),
        ]
    } else {
        [
            vreinterpretq_s32_u16(vmovl_u8(vget_low_u8(raw))),
            vreinterpretq_s32_u16(vmovl_high_u8(raw)),
        ]
    };
    // Lane = first | second << 16: sign-extend each half.
    let first = halves.map(|h| vshrq_n_s32::<16>(vshlq_n_s32::<16>(h)));
    let second = halves.map(|h| vshrq_n_s32::<16>(h));
    (first, second)
}

#[inline(always)]
unsafe fn load2(p: *const u8) -> [uint8x16_t; 2] {
    [vld1q_u8(p), vld1q_u8(p.add(16))]
}

/// 0x10 where bit `k` of a packed `qh` byte is set.
#[inline(always)]
unsafe fn fifth(h: uint8x16_t, k: i8) -> uint8x16_t {
    vandq_u8(vshlq_u8(h, vdupq_n_s8(4 - k)), vdupq_n_u8(0x10))
}

/// Q4_K/Q5_K: per token, `(isum, msum)` for rows 0-3 and 4-7.
#[inline(always)]
unsafe fn k4_sums<const DOT: bool, const T: usize, const FIVE: bool>(
    grp: *const u8,
    l: &GroupLayout,
    x: [&BlockQ8K; T],
) -> [([int32x4_t; 2], [int32x4_t; 2]); T] {
    let low4 = vdupq_n_u8(0x0F);
    let zero = vdupq_n_s32(0);
    let mut out = [([zero; 2], [zero; 2]); T];
    let y: [*const i8; T] = std::array::from_fn(|t| x[t].qs.as_ptr());
    for j in 0..4 {
        let (sc_lo, sc_hi) = pairs(grp.add(l.sc.unwrap_or(0) + 16 * j), false);
        let mut alo = [[zero; 2]; T];
        let mut ahi = [[zero; 2]; T];
        for c in 0..8 {
            let v = load2(grp.add(l.qs + 32 * (8 * j + c)));
            let h = FIVE.then(|| load2(grp.add(l.qh.unwrap_or(0) + 32 * c)));
            for half in 0..2 {
                let mut lo = vandq_u8(v[half], low4);
                let mut hi = vshrq_n_u8::<4>(v[half]);
                if let Some(h) = h {
                    lo = vorrq_u8(lo, fifth(h[half], 2 * j as i8));
                    hi = vorrq_u8(hi, fifth(h[half], 2 * j as i8 + 1));
                }
                for t in 0..T {
                    let xl = bcast4(y[t], 64 * j + 4 * c);
                    let xh = bcast4(y[t], 64 * j + 32 + 4 * c);
                    alo[t][half] = lane_dot::<DOT>(alo[t][half], vreinterpretq_s8_u8(lo), xl);
                    ahi[t][half] = lane_dot::<DOT>(ahi[t][half], vreinterpretq_s8_u8(hi), xh);
                }
            }
        }
        let (mn_lo, mn_hi) = pairs(grp.add(l.mn.unwrap_or(0) + 16 * j), false);
        for t in 0..T {
            let b = bsum32_pairs(x[t])[j];
            let (b0, b1) = (b as i16 as i32, b >> 16);
            for half in 0..2 {
                let i = vmlaq_s32(out[t].0[half], alo[t][half], sc_lo[half]);
                out[t].0[half] = vmlaq_s32(i, ahi[t][half], sc_hi[half]);
                let m = vmlaq_n_s32(out[t].1[half], mn_lo[half], b0);
                out[t].1[half] = vmlaq_n_s32(m, mn_hi[half], b1);
            }
        }
    }
    out
}

/// Q6_K: per token, the integer sums with the `-32` offset taken out, rows 0-3 and 4-7.
#[inline(always)]
unsafe fn k6_sums<const DOT: bool, const T: usize>(
    grp: *const u8,
    l: &GroupLayout,
    x: [&BlockQ8K; T],
) -> [[int32x4_t; 2]; T] {
    let low4 = vdupq_n_u8(0x0F);
    let mask = vdupq_n_u8(0x30);
    let zero = vdupq_n_s32(0);
    let sc_at = l.sc.unwrap_or(0);
    let mut isum = [[zero; 2]; T];
    let y: [*const i8; T] = std::array::from_fn(|t| x[t].qs.as_ptr());
    for n in 0..2 {
        for a in 0..2 {
            let scl = pairs(grp.add(sc_at + 16 * (4 * n + a)), true);
            let sch = pairs(grp.add(sc_at + 16 * (4 * n + a + 2)), true);
            let scs = [[scl.0, scl.1], [sch.0, sch.1]];
            for sub in 0..2 {
                let mut acc = [[[zero; 2]; 2]; T];
                for c in 4 * sub..4 * sub + 4 {
                    let v = load2(grp.add(l.qs + 32 * (8 * (2 * n + a) + c)));
                    let h = load2(grp.add(l.qh.unwrap_or(0) + 32 * (8 * n + c)));
                    for half in 0..2 {
                        // qh bits (2a, 2a + 1) with the low nibble, (4 + 2a, 5 + 2a) with the
                        // high one, moved to bits 4 and 5.
                        let hl = vshlq_u8(h[half], vdupq_n_s8(4 - 2 * a as i8));
                        let hh = vshlq_u8(h[half], vdupq_n_s8(-2 * a as i8));
                        let ql = vorrq_u8(vandq_u8(v[half], low4), vandq_u8(hl, mask));
                        let qhi = vorrq_u8(vshrq_n_u8::<4>(v[half]), vandq_u8(hh, mask));
                        let e = 128 * n + 32 * a + 4 * c;
                        for t in 0..T {
                            let (xl, xh) = (bcast4(y[t], e), bcast4(y[t], e + 64));
                            acc[t][0][half] =
                                lane_dot::<DOT>(acc[t][0][half], vreinterpretq_s8_u8(ql), xl);
                            acc[t][1][half] =
                                lane_dot::<DOT>(acc[t][1][half], vreinterpretq_s8_u8(qhi), xh);
                        }
                    }
                }
                for t in 0..T {
                    for high in 0..2 {
                        let sc = if sub == 0 { scs[high][0] } else { scs[high][1] };
                        for half in 0..2 {
                            isum[t][half] = vmlaq_s32(isum[t][half], acc[t][high][half], sc[half]);
                        }
                    }
                }
            }
        }
    }
    for p in 0..8 {
        let (s0, s1) = pairs(grp.add(sc_at + 16 * p), true);
        for t in 0..T {
            let (b0, b1) = (x[t].bsums[2 * p] as i32, x[t].bsums[2 * p + 1] as i32);
            for half in 0..2 {
                let off = vmlaq_n_s32(vmulq_n_s32(s0[half], b0), s1[half], b1);
                isum[t][half] = vsubq_s32(isum[t][half], vshlq_n_s32::<5>(off));
            }
        }
    }
    isum
}

#[inline(always)]
unsafe fn rows8k_body<const DOT: bool, const T: usize>(
    ty: QuantType,
    groups: &[u8],
    x: [&[BlockQ8K]; T],
) -> [[float32x4_t; 2]; T] {
    let l = group_layout(ty).expect("packable type");
    let nb = groups.len() / l.bytes;
    for xt in x {
        assert!(xt.len() >= nb);
    }
    let mut acc = [[vdupq_n_f32(0.0); 2]; T];
    for b in 0..nb {
        let grp = groups.as_ptr().add(b * l.bytes);
        let xb: [&BlockQ8K; T] = std::array::from_fn(|t| x[t].get_unchecked(b));
        let dw = f16x8(grp);
        let dw = [dw.0, dw.1];
        if ty == QuantType::Q6_K {
            let isum = k6_sums::<DOT, T>(grp, &l, xb);
            for t in 0..T {
                for h in 0..2 {
                    // `crate::quant::term::scaled`, lane by lane.
                    let d = vmulq_n_f32(dw[h], xb[t].d);
                    acc[t][h] = vaddq_f32(acc[t][h], vmulq_f32(d, vcvtq_f32_s32(isum[t][h])));
                }
            }
            continue;
        }
        let sums = if ty == QuantType::Q5_K {
            k4_sums::<DOT, T, true>(grp, &l, xb)
        } else {
            k4_sums::<DOT, T, false>(grp, &l, xb)
        };
        let dmin = f16x8(grp.add(l.dmin.unwrap_or(0)));
        let dmin = [dmin.0, dmin.1];
        for t in 0..T {
            for h in 0..2 {
                // `crate::quant::term::k_min`, lane by lane: dx * (d * sums - dmin * mins).
                let scaled = vmulq_f32(dw[h], vcvtq_f32_s32(sums[t].0[h]));
                let mins = vmulq_f32(dmin[h], vcvtq_f32_s32(sums[t].1[h]));
                let term = vmulq_n_f32(vsubq_f32(scaled, mins), xb[t].d);
                acc[t][h] = vaddq_f32(acc[t][h], term);
            }
        }
    }
    acc
}

#[inline(always)]
unsafe fn rows8k_n<const DOT: bool>(
    ty: QuantType,
    g: &[u8],
    x: [&[BlockQ8K]; 4],
    n: usize,
    out: &mut [[f32; GROUP_ROWS]; 4],
) {
    macro_rules! run {
        ($t:literal) => {{
            let acc = rows8k_body::<DOT, $t>(ty, g, std::array::from_fn(|i| x[i]));
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
unsafe fn rows8k_neon<const TY: u32>(
    g: &[u8],
    x: [&[BlockQ8K]; 4],
    n: usize,
    out: &mut [[f32; GROUP_ROWS]; 4],
) {
    let ty = QuantType::from_ggml_id(TY).expect("k-quant id");
    rows8k_n::<false>(ty, g, x, n, out)
}

/// # Safety
/// The CPU must support the dotprod extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn rows8k_dot<const TY: u32>(
    g: &[u8],
    x: [&[BlockQ8K]; 4],
    n: usize,
    out: &mut [[f32; GROUP_ROWS]; 4],
) {
    let ty = QuantType::from_ggml_id(TY).expect("k-quant id");
    rows8k_n::<true>(ty, g, x, n, out)
}

/// The interleaved k-quant kernel of the type with GGML id `TY`, with `sdot` if `dot`.
pub(super) fn rows8k<const TY: u32>(dot: bool) -> crate::packed::Rows8KFn {
    if dot {
        |g, x, n, out| unsafe { rows8k_dot::<TY>(g, x, n, out) }
    } else {
        |g, x, n, out| unsafe { rows8k_neon::<TY>(g, x, n, out) }
    }
}
