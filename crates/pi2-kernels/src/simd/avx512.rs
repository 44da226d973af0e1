//! AVX-512 (F + BW + VL) kernels: two 32-element blocks per 512-bit register, so each
//! `maddubs`/`madd`/convert/FMA covers twice the weights of the AVX2 path. An odd last block goes
//! through the AVX2 block code (AVX-512 CPUs have AVX2). The VNNI tier swaps `vpdpbusd` into the
//! 256-bit kernels it shares with AVX2 (see `avx2_x8.rs`).
//!
//! # Safety
//! Every `unsafe fn` here executes x86 SIMD instructions: call it only on a CPU with the
//! features its `#[target_feature]` entry point enables (a `KernelSet` of a tier hands these
//! out only after `Tier::is_supported`). Slices are read within their bounds; raw pointers
//! point into blocks the caller passed, at offsets the block layout defines.

use super::avx2::{self, Block32};
use super::x86::{hsum_epi32, Flavour, Maddubs, PREFETCH};
use super::{KernelSet, RowKernels, Tier};
use crate::quant::{
    BlockIQ4NL, BlockMXFP4, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8, BlockQ8_0,
};
use std::arch::x86_64::*;

/// The AVX-512 set; `tier` `Avx512Vnni` swaps in `vpdpbusd` where a kernel has a VNNI form.
pub(super) fn kernel_set(tier: Tier) -> KernelSet {
    let flavour = if tier == Tier::Avx512Vnni {
        Flavour::Avx512Vnni
    } else {
        Flavour::Avx2
    };
    KernelSet {
        tier,
        f32: |w, x| unsafe { avx2::dot_f32(w, x) },
        f16: |w, x| unsafe { avx2::dot_f16(w, x) },
        axpy_f16: |a, x, y| unsafe { avx2::axpy_f16(a, x, y) },
        bf16: |w, x| unsafe { avx2::dot_bf16(w, x) },
        axpy_bf16: |a, x, y| unsafe { avx2::axpy_bf16(a, x, y) },
        q4_0: tiles::<BlockQ4_0>(flavour),
        iq4_nl: tiles::<BlockIQ4NL>(flavour),
        iq4_xs: super::avx2_k::rows(),
        q2_k: super::avx2_k::rows(),
        q3_k: super::avx2_k::rows(),
        mxfp4: tiles::<BlockMXFP4>(flavour),
        q4_1: tiles::<BlockQ4_1>(flavour),
        q5_0: tiles::<BlockQ5_0>(flavour),
        q5_1: tiles::<BlockQ5_1>(flavour),
        q8_0: tiles::<BlockQ8_0>(flavour),
        // k-quants: the AVX2 kernels (a 256-element block is 8 AVX2 steps; not yet widened).
        q4_k: super::avx2_k::rows(),
        q5_k: super::avx2_k::rows(),
        q6_k: super::avx2_k::rows(),
        // The interleaved kernels are 256-bit: eight rows of 32-bit lanes.
        x8: avx2::x8_kernels(flavour),
    }
}

/// One token (decode matvec) keeps the 256-bit kernels (with `vpdpbusd` on the VNNI tier):
/// measured faster out of cache on this tier's development CPU (Q4_1 matvec 4.41 vs 3.62
/// GiB/s); the wider registers only pay off when each unpacked weight pair serves two tokens
/// (GEMM 21.5 vs 17.2 M outputs/s). The 512-bit two-token tile keeps `maddubs`.
fn tiles<B: Pair + crate::quant::QuantBlock<Act = BlockQ8>>(flavour: Flavour) -> RowKernels<B> {
    RowKernels {
        dot4x2: |w, x| unsafe { tile::<B, 4, 2>(w, x) },
        ..avx2::tiles::<B>(flavour)
    }
}

/// Lane layout of a block pair (i, j), as 4 x 128 bits: [i 0..16, j 0..16, i 16..32, j 16..32].
/// Activations are rearranged to match once per pair and shared by every row.
#[inline(always)]
unsafe fn act_pair(xi: &BlockQ8, xj: &BlockQ8) -> __m512i {
    let a = _mm256_loadu_si256(xi.qs.as_ptr() as *const __m256i);
    let b = _mm256_loadu_si256(xj.qs.as_ptr() as *const __m256i);
    let lo = _mm256_permute2x128_si256(a, b, 0x20);
    let hi = _mm256_permute2x128_si256(a, b, 0x31);
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// Nibbles of a Q4 block pair in the same layout: low nibbles are elements 0..16.
#[inline(always)]
unsafe fn nibble_pair(qi: &[u8; 16], qj: &[u8; 16]) -> __m512i {
    let raw = _mm256_set_m128i(
        _mm_loadu_si128(qj.as_ptr() as *const __m128i),
        _mm_loadu_si128(qi.as_ptr() as *const __m128i),
    );
    let both = _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1);
    _mm512_and_si512(both, _mm512_set1_epi8(0x0F))
}

#[inline(always)]
unsafe fn sum_pairs(p16: __m512i) -> __m512i {
    _mm512_madd_epi16(p16, _mm512_set1_epi16(1))
}

/// A block type the 512-bit path handles two at a time.
trait Pair: Block32 {
    /// Per-activation-pair work shared by all rows (the activation sum for Q4_0's offset).
    unsafe fn shared2(y: __m512i) -> __m512i;
    /// Exact integer dot products of blocks (i, j) with the activation pair, as 16 i32 lanes.
    unsafe fn idot2(wi: &Self, wj: &Self, y: __m512i, shared: __m512i) -> __m512i;
}

impl Pair for BlockQ4_0 {
    #[inline(always)]
    unsafe fn shared2(y: __m512i) -> __m512i {
        sum_pairs(_mm512_maddubs_epi16(_mm512_set1_epi8(1), y))
    }
    #[inline(always)]
    unsafe fn idot2(wi: &Self, wj: &Self, y: __m512i, sum_y: __m512i) -> __m512i {
        let q = sum_pairs(_mm512_maddubs_epi16(nibble_pair(&wi.qs, &wj.qs), y));
        _mm512_sub_epi32(q, _mm512_slli_epi32(sum_y, 3))
    }
}

impl Pair for BlockQ4_1 {
    #[inline(always)]
    unsafe fn shared2(_: __m512i) -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn idot2(wi: &Self, wj: &Self, y: __m512i, _: __m512i) -> __m512i {
        sum_pairs(_mm512_maddubs_epi16(nibble_pair(&wi.qs, &wj.qs), y))
    }
}

/// The fifth bits of a Q5 block pair (0x10 where set) in the pair layout.
#[inline(always)]
unsafe fn fifth_pair(qhi: [u8; 4], qhj: [u8; 4]) -> __m512i {
    let (a, b) = (avx2::fifth_bits(qhi), avx2::fifth_bits(qhj));
    let lo = _mm256_permute2x128_si256(a, b, 0x20);
    let hi = _mm256_permute2x128_si256(a, b, 0x31);
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

impl Pair for BlockQ5_0 {
    #[inline(always)]
    unsafe fn shared2(y: __m512i) -> __m512i {
        sum_pairs(_mm512_maddubs_epi16(_mm512_set1_epi8(1), y))
    }
    #[inline(always)]
    unsafe fn idot2(wi: &Self, wj: &Self, y: __m512i, sum_y: __m512i) -> __m512i {
        let q = _mm512_or_si512(nibble_pair(&wi.qs, &wj.qs), fifth_pair(wi.qh, wj.qh));
        let q = sum_pairs(_mm512_maddubs_epi16(q, y));
        _mm512_sub_epi32(q, _mm512_slli_epi32(sum_y, 4))
    }
}

impl Pair for BlockQ5_1 {
    #[inline(always)]
    unsafe fn shared2(_: __m512i) -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn idot2(wi: &Self, wj: &Self, y: __m512i, _: __m512i) -> __m512i {
        let q = _mm512_or_si512(nibble_pair(&wi.qs, &wj.qs), fifth_pair(wi.qh, wj.qh));
        sum_pairs(_mm512_maddubs_epi16(q, y))
    }
}

impl Pair for BlockQ8_0 {
    #[inline(always)]
    unsafe fn shared2(_: __m512i) -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn idot2(wi: &Self, wj: &Self, y: __m512i, _: __m512i) -> __m512i {
        let a = _mm256_loadu_si256(wi.qs.as_ptr() as *const __m256i);
        let b = _mm256_loadu_si256(wj.qs.as_ptr() as *const __m256i);
        let lo = _mm256_permute2x128_si256(a, b, 0x20);
        let hi = _mm256_permute2x128_si256(a, b, 0x31);
        let w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        signed_dot(w, y)
    }
}

/// `|w|` times `y` with the sign of `w` moved onto `y`, summed to 16 i32 lanes.
#[inline(always)]
unsafe fn signed_dot(w: __m512i, y: __m512i) -> __m512i {
    let neg = _mm512_movepi8_mask(w);
    let sy = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
    sum_pairs(_mm512_maddubs_epi16(_mm512_abs_epi8(w), sy))
}

impl Pair for BlockMXFP4 {
    #[inline(always)]
    unsafe fn shared2(_: __m512i) -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn idot2(wi: &Self, wj: &Self, y: __m512i, _: __m512i) -> __m512i {
        let table = _mm_loadu_si128(crate::quant::mxfp4::MXFP4_TABLE.as_ptr() as *const __m128i);
        let w = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(table), nibble_pair(&wi.qs, &wj.qs));
        signed_dot(w, y)
    }
}

impl Pair for BlockIQ4NL {
    #[inline(always)]
    unsafe fn shared2(_: __m512i) -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn idot2(wi: &Self, wj: &Self, y: __m512i, _: __m512i) -> __m512i {
        let table = _mm_loadu_si128(crate::quant::iq4_nl::IQ4NL_TABLE.as_ptr() as *const __m128i);
        let w = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(table), nibble_pair(&wi.qs, &wj.qs));
        signed_dot(w, y)
    }
}

/// `R` rows against `T` activation rows, two blocks per step. Each block's integer sum is made
/// exact and added as its `term`, in block order: the scalar reference's value, bit for bit.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn tile<B: Pair, const R: usize, const T: usize>(
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
    let mut i = 0;
    while i + 2 <= n {
        let mut y = [_mm512_setzero_si512(); T];
        let mut shared = [_mm512_setzero_si512(); T];
        for t in 0..T {
            y[t] = act_pair(x[t].get_unchecked(i), x[t].get_unchecked(i + 1));
            shared[t] = B::shared2(y[t]);
        }
        let mut halves = [[_mm256_setzero_si256(); R]; T];
        for r in 0..R {
            let (wi, wj) = (w[r].get_unchecked(i), w[r].get_unchecked(i + 1));
            _mm_prefetch::<_MM_HINT_T0>((wi as *const B as *const i8).wrapping_add(PREFETCH));
            for t in 0..T {
                // Lanes 0-3 and 8-11 belong to block i, 4-7 and 12-15 to block j: folded to
                // 8 lanes, block i's partial sums are lanes 0-3 and block j's 4-7.
                let p = B::idot2(wi, wj, y[t], shared[t]);
                halves[t][r] =
                    _mm256_add_epi32(_mm512_castsi512_si256(p), _mm512_extracti64x4_epi64(p, 1));
            }
        }
        for (t, h) in halves.into_iter().enumerate() {
            let sums = pair_sums(h);
            let (xi, xj) = (x[t].get_unchecked(i), x[t].get_unchecked(i + 1));
            for r in 0..R {
                let (wi, wj) = (w[r].get_unchecked(i), w[r].get_unchecked(i + 1));
                out[r][t] += wi.term(xi, sums[r].0);
                out[r][t] += wj.term(xj, sums[r].1);
            }
        }
        i += 2;
    }
    if i < n {
        // odd last block: the AVX2 block code
        for t in 0..T {
            let xb = x[t].get_unchecked(i);
            let yv = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
            let sh = B::shared::<Maddubs>(yv);
            for r in 0..R {
                let wb = w[r].get_unchecked(i);
                out[r][t] += wb.term(xb, hsum_epi32(wb.idot::<Maddubs>(yv, sh)));
            }
        }
    }
    out
}

/// Each row's (block i, block j) sums from its 8 lanes (i in 0-3, j in 4-7): four rows through
/// `hadd` at once, exact.
#[inline(always)]
unsafe fn pair_sums<const R: usize>(h: [__m256i; R]) -> [(i32, i32); R] {
    let mut out = [(0, 0); R];
    if R == 4 {
        let a = _mm256_hadd_epi32(h[0], h[1 % R]);
        let b = _mm256_hadd_epi32(h[2 % R], h[3 % R]);
        let mut sums = [0i32; 8];
        _mm256_storeu_si256(sums.as_mut_ptr() as *mut __m256i, _mm256_hadd_epi32(a, b));
        for r in 0..R {
            out[r] = (sums[r % 4], sums[4 + r % 4]);
        }
    } else {
        for r in 0..R {
            let (lo, hi) = (
                _mm256_castsi256_si128(h[r]),
                _mm256_extracti128_si256(h[r], 1),
            );
            let s = _mm_hadd_epi32(_mm_hadd_epi32(lo, hi), _mm_setzero_si128());
            out[r] = (_mm_extract_epi32(s, 0), _mm_extract_epi32(s, 1));
        }
    }
    out
}
