//! aarch64 k-quant kernels (Q4_K, Q5_K, Q6_K against Q8_K activations), NEON and dotprod from
//! one generic body (`DOT` picks the integer product, as in `neon.rs`). The unpacked weights are
//! at most 63, so they are valid signed bytes and `sdot` multiplies them with the activations
//! directly; each sub-block's lanes are scaled with one `mla` by its scale. The per-sub-block mins
//! (Q4_K, Q5_K) and Q6_K's `-32` offset are small scalar sums over the activation `bsums`.
//!
//! # Safety
//! Every `unsafe fn` here executes NEON (and, for the dotprod tier, `sdot`) instructions:
//! call it only on a CPU with the features its `#[target_feature]` entry point enables (a
//! `KernelSet` of a tier hands these out only after `Tier::is_supported`). Slices are read
//! within their bounds; raw pointers point into blocks the caller passed, at offsets the block
//! layout defines.

use super::arm::idot;
use super::{KTerm, RowKernels};
use crate::quant::{
    iq4_nl::IQ4NL_TABLE, scale_min_k4, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K,
    BlockQ6K, BlockQ8K, QuantBlock,
};
use std::arch::aarch64::*;

/// One weight block against one activation block: the scaled integer sum and the integer
/// [`KTerm`] takes beside it (mins or offset).
pub(super) trait KBlock: QuantBlock<Act = BlockQ8K> + KTerm + Copy {
    unsafe fn block<const DOT: bool>(&self, x: &BlockQ8K) -> (i32, i32);
}

pub(super) fn rows<B: KBlock>(dot: bool) -> RowKernels<B> {
    if dot {
        RowKernels {
            dot: |w, x| unsafe { dot_dotprod::<B>(w, x) },
            dot4: |w, x| w.map(|r| unsafe { dot_dotprod::<B>(r, x) }),
            dot4x2: |w, x| w.map(|r| x.map(|xt| unsafe { dot_dotprod::<B>(r, xt) })),
            axpy: super::axpy_ref::<B>,
        }
    } else {
        RowKernels {
            dot: |w, x| unsafe { dot_neon::<B>(w, x) },
            dot4: |w, x| w.map(|r| unsafe { dot_neon::<B>(r, x) }),
            dot4x2: |w, x| w.map(|r| x.map(|xt| unsafe { dot_neon::<B>(r, xt) })),
            axpy: super::axpy_ref::<B>,
        }
    }
}

#[inline(always)]
unsafe fn dot_body<B: KBlock, const DOT: bool>(w: &[B], x: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, xb) in w.iter().zip(x) {
        let (sums, extra) = wb.block::<DOT>(xb);
        sum += wb.k_term(xb, sums, extra);
    }
    sum
}

/// # Safety
/// NEON is part of every aarch64 target Rust supports.
#[target_feature(enable = "neon")]
unsafe fn dot_neon<B: KBlock>(w: &[B], x: &[BlockQ8K]) -> f32 {
    dot_body::<B, false>(w, x)
}

/// # Safety
/// The CPU must support the dotprod extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn dot_dotprod<B: KBlock>(w: &[B], x: &[BlockQ8K]) -> f32 {
    dot_body::<B, true>(w, x)
}

#[inline(always)]
unsafe fn load_x(x: &BlockQ8K, at: usize) -> int8x16_t {
    debug_assert!(at + 16 <= x.qs.len());
    vld1q_s8(x.qs.as_ptr().add(at))
}

#[inline(always)]
unsafe fn s8(v: uint8x16_t) -> int8x16_t {
    vreinterpretq_s8_u8(v)
}

/// Bits `shift..shift+width` of every byte (`mask` = the width's ones), moved to bit 4.
#[inline(always)]
unsafe fn high_bits(v: uint8x16_t, shift: i8, mask: u8) -> uint8x16_t {
    vshlq_n_u8(
        vandq_u8(vshlq_u8(v, vdupq_n_s8(-shift)), vdupq_n_u8(mask)),
        4,
    )
}

/// Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins.
#[inline(always)]
unsafe fn k4_like<const DOT: bool>(
    qs: &[u8; 128],
    qh: Option<&[u8; 32]>,
    scales: &[u8; 12],
    x: &BlockQ8K,
) -> (i32, i32) {
    let low4 = vdupq_n_u8(0x0F);
    let h = qh.map(|h| (vld1q_u8(h.as_ptr()), vld1q_u8(h.as_ptr().add(16))));
    let mut acc = vdupq_n_s32(0);
    let mut mins = 0i32;
    for j in 0..4 {
        let (sc0, m0) = scale_min_k4(2 * j, scales);
        let (sc1, m1) = scale_min_k4(2 * j + 1, scales);
        let q0 = vld1q_u8(qs.as_ptr().add(32 * j));
        let q1 = vld1q_u8(qs.as_ptr().add(32 * j + 16));
        let (mut l0, mut l1) = (vandq_u8(q0, low4), vandq_u8(q1, low4));
        let (mut h0, mut h1) = (vshrq_n_u8(q0, 4), vshrq_n_u8(q1, 4));
        if let Some((hb0, hb1)) = h {
            let (lo_bit, hi_bit) = (2 * j as i8, 2 * j as i8 + 1);
            l0 = vorrq_u8(l0, high_bits(hb0, lo_bit, 1));
            l1 = vorrq_u8(l1, high_bits(hb1, lo_bit, 1));
            h0 = vorrq_u8(h0, high_bits(hb0, hi_bit, 1));
            h1 = vorrq_u8(h1, high_bits(hb1, hi_bit, 1));
        }
        let base = 64 * j;
        let lo = idot::<DOT>(
            idot::<DOT>(vdupq_n_s32(0), s8(l0), load_x(x, base)),
            s8(l1),
            load_x(x, base + 16),
        );
        let hi = idot::<DOT>(
            idot::<DOT>(vdupq_n_s32(0), s8(h0), load_x(x, base + 32)),
            s8(h1),
            load_x(x, base + 48),
        );
        acc = vmlaq_n_s32(acc, lo, sc0 as i32);
        acc = vmlaq_n_s32(acc, hi, sc1 as i32);
        let b = &x.bsums[4 * j..4 * j + 4];
        mins += m0 as i32 * (b[0] as i32 + b[1] as i32) + m1 as i32 * (b[2] as i32 + b[3] as i32);
    }
    (vaddvq_s32(acc), mins)
}

/// Q2_K and Q3_K's shared 2-bit layout (see `avx2_k.rs`): `third(h, j, p)` is Q3_K's third
/// bit moved to 4 (zero for Q2_K), `scale(sb)` the sub-block scales. Returns the scaled sum.
#[inline(always)]
unsafe fn two_bit_sums<const DOT: bool>(
    qs: &[u8; 64],
    x: &BlockQ8K,
    third: impl Fn(usize, usize, usize) -> uint8x16_t,
    scale: impl Fn(usize) -> i32,
) -> i32 {
    let mut acc = vdupq_n_s32(0);
    for h in 0..2 {
        for p in 0..2 {
            let q = vld1q_u8(qs.as_ptr().add(32 * h + 16 * p));
            for j in 0..4 {
                let bits = vandq_u8(vshlq_u8(q, vdupq_n_s8(-2 * j as i8)), vdupq_n_u8(3));
                let u = s8(vorrq_u8(bits, third(h, j, p)));
                let s = idot::<DOT>(vdupq_n_s32(0), u, load_x(x, 128 * h + 32 * j + 16 * p));
                acc = vmlaq_n_s32(acc, s, scale(8 * h + 2 * j + p));
            }
        }
    }
    vaddvq_s32(acc)
}

impl KBlock for BlockQ2K {
    #[inline(always)]
    unsafe fn block<const DOT: bool>(&self, x: &BlockQ8K) -> (i32, i32) {
        let sums = two_bit_sums::<DOT>(
            &self.qs,
            x,
            |_, _, _| vdupq_n_u8(0),
            |sb| (self.scales[sb] & 0x0F) as i32,
        );
        let mins: i32 = (0..16)
            .map(|sb| (self.scales[sb] >> 4) as i32 * x.bsums[sb] as i32)
            .sum();
        (sums, mins)
    }
}

impl KBlock for BlockQ3K {
    #[inline(always)]
    unsafe fn block<const DOT: bool>(&self, x: &BlockQ8K) -> (i32, i32) {
        let s = self.sub_scales();
        let hm = [
            vld1q_u8(self.hmask.as_ptr()),
            vld1q_u8(self.hmask.as_ptr().add(16)),
        ];
        let sums = two_bit_sums::<DOT>(
            &self.qs,
            x,
            |h, j, p| {
                let bit = vandq_u8(
                    vshlq_u8(hm[p], vdupq_n_s8(-((4 * h + j) as i8))),
                    vdupq_n_u8(1),
                );
                vshlq_n_u8(bit, 2)
            },
            |sb| s[sb],
        );
        let offset: i32 = (0..16).map(|sb| s[sb] * x.bsums[sb] as i32).sum();
        (sums, offset)
    }
}

/// IQ4_XS: 8 sub-blocks of 32 signed table levels (a `tbl` lookup), each with a signed 6-bit
/// scale.
impl KBlock for BlockIQ4XS {
    #[inline(always)]
    unsafe fn block<const DOT: bool>(&self, x: &BlockQ8K) -> (i32, i32) {
        let table = vld1q_s8(IQ4NL_TABLE.as_ptr());
        let mut acc = vdupq_n_s32(0);
        for ib in 0..8 {
            let q = vld1q_u8(self.qs.as_ptr().add(16 * ib));
            let lo = vqtbl1q_s8(table, vandq_u8(q, vdupq_n_u8(0x0F)));
            let hi = vqtbl1q_s8(table, vshrq_n_u8(q, 4));
            let s = idot::<DOT>(
                idot::<DOT>(vdupq_n_s32(0), lo, load_x(x, 32 * ib)),
                hi,
                load_x(x, 32 * ib + 16),
            );
            acc = vmlaq_n_s32(acc, s, self.scale(ib));
        }
        (vaddvq_s32(acc), 0)
    }
}

impl KBlock for BlockQ4K {
    #[inline(always)]
    unsafe fn block<const DOT: bool>(&self, x: &BlockQ8K) -> (i32, i32) {
        k4_like::<DOT>(&self.qs, None, &self.scales, x)
    }
}

impl KBlock for BlockQ5K {
    #[inline(always)]
    unsafe fn block<const DOT: bool>(&self, x: &BlockQ8K) -> (i32, i32) {
        k4_like::<DOT>(&self.qs, Some(&self.qh), &self.scales, x)
    }
}

impl KBlock for BlockQ6K {
    /// Two halves of 128; in each, four quarters of 32 (low/high nibbles of `ql`, 2-bit pairs of
    /// `qh`); a 16-byte vector is exactly one sub-block with its own int8 scale.
    #[inline(always)]
    unsafe fn block<const DOT: bool>(&self, x: &BlockQ8K) -> (i32, i32) {
        let low4 = vdupq_n_u8(0x0F);
        let mut acc = vdupq_n_s32(0);
        for half in 0..2 {
            let ql = self.ql.as_ptr().add(64 * half);
            let qh = self.qh.as_ptr().add(32 * half);
            let l = [
                vld1q_u8(ql),
                vld1q_u8(ql.add(16)),
                vld1q_u8(ql.add(32)),
                vld1q_u8(ql.add(48)),
            ];
            let h = [vld1q_u8(qh), vld1q_u8(qh.add(16))];
            for k in 0..4 {
                // Quarter k: ql bytes 0..32 (k even) or 32..64 (k odd), low nibbles for k < 2.
                for part in 0..2 {
                    let src = l[2 * (k & 1) + part];
                    let low = if k < 2 {
                        vandq_u8(src, low4)
                    } else {
                        vshrq_n_u8(src, 4)
                    };
                    let q = vorrq_u8(low, high_bits(h[part], 2 * k as i8, 3));
                    let at = 128 * half + 32 * k + 16 * part;
                    let s = idot::<DOT>(vdupq_n_s32(0), s8(q), load_x(x, at));
                    acc = vmlaq_n_s32(acc, s, self.scales[at / 16] as i32);
                }
            }
        }
        let offset: i32 = self
            .scales
            .iter()
            .zip(&x.bsums)
            .map(|(&s, &b)| s as i32 * b as i32)
            .sum();
        (vaddvq_s32(acc), offset)
    }
}
