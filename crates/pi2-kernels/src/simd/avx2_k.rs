//! AVX2 k-quant kernels (Q4_K, Q5_K, Q6_K, and IQ4_XS, against Q8_K activations), also used by the AVX-512
//! tier. The weights are unsigned (Q6_K's `q - 32` offset is taken out through the activation
//! block sums), so `maddubs` multiplies them with the signed activations directly, and a `madd`
//! with the sub-block scale turns the i16 pairs into scaled i32 lanes. The per-sub-block mins
//! (Q4_K, Q5_K) and the Q6_K offset are small scalar sums over `bsums`.
//!
//! # Safety
//! Every `unsafe fn` here executes x86 SIMD instructions: call it only on a CPU with the
//! features its `#[target_feature]` entry point enables (a `KernelSet` of a tier hands these
//! out only after `Tier::is_supported`). Slices are read within their bounds; raw pointers
//! point into blocks the caller passed, at offsets the block layout defines.

use super::x86::{hsum_epi32, iq4nl_values};
use super::{KTerm, RowKernels};
use crate::quant::{
    scale_min_k4, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K,
    QuantBlock,
};
use std::arch::x86_64::*;

/// One weight block against one activation block: scaled integer sums in 8 i32 lanes and the
/// integer [`KTerm`] takes beside them (mins or offset).
pub(super) trait KBlock: QuantBlock<Act = BlockQ8K> + KTerm + Copy {
    unsafe fn block(&self, x: &BlockQ8K) -> (__m256i, i32);
}

/// The row kernels of a k-quant type: `dot4`/`dot4x2` are row-by-row (k-quant rows are long
/// enough that the activation block stays in L1 between rows).
pub(super) fn rows<B: KBlock>() -> RowKernels<B> {
    RowKernels {
        dot: |w, x| unsafe { dot::<B>(w, x) },
        dot4: |w, x| w.map(|r| unsafe { dot::<B>(r, x) }),
        dot4x2: |w, x| w.map(|r| x.map(|xt| unsafe { dot::<B>(r, xt) })),
        // axpy runs on transposed down rows, which pi2 stores in 32-element formats.
        axpy: super::axpy_ref::<B>,
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot<B: KBlock>(w: &[B], x: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, xb) in w.iter().zip(x) {
        let (sums, extra) = wb.block(xb);
        sum += wb.k_term(xb, hsum_epi32(sums), extra);
    }
    sum
}

#[inline(always)]
unsafe fn load(p: &[u8]) -> __m256i {
    debug_assert!(p.len() >= 32);
    _mm256_loadu_si256(p.as_ptr() as *const __m256i)
}

#[inline(always)]
unsafe fn load_i8(p: &[i8]) -> __m256i {
    debug_assert!(p.len() >= 32);
    _mm256_loadu_si256(p.as_ptr() as *const __m256i)
}

/// `(q . x)` over 32 bytes, every 16-element half times its own scale, as 8 i32 lanes.
#[inline(always)]
unsafe fn scaled(q: __m256i, x: __m256i, sc_lo: i16, sc_hi: i16) -> __m256i {
    let scale = _mm256_set_m128i(_mm_set1_epi16(sc_hi), _mm_set1_epi16(sc_lo));
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), scale)
}

/// Bits `shift..shift+width` of every byte of `v`, moved to bit 4 (the high part of a k-quant).
#[inline(always)]
unsafe fn high_bits(v: __m256i, shift: i32, mask: i8) -> __m256i {
    let s = _mm256_srl_epi16(v, _mm_cvtsi32_si128(shift));
    _mm256_slli_epi16(_mm256_and_si256(s, _mm256_set1_epi8(mask)), 4)
}

/// Q2_K and Q3_K share their 2-bit layout: bit pair `j` of the 32 bytes of half `h` is the 32
/// activations from `128h + 32j` on, two sub-blocks of 16 (low and high lanes). `third(h, j)`
/// gives Q3_K's third bit (4 where set), zero for Q2_K; `scale(sb)` the sub-block scales.
#[inline(always)]
unsafe fn two_bit_sums(
    qs: &[u8; 64],
    x: &BlockQ8K,
    third: impl Fn(usize, usize) -> __m256i,
    scale: impl Fn(usize) -> i16,
) -> __m256i {
    let mut acc = _mm256_setzero_si256();
    for h in 0..2 {
        let q = load(&qs[32 * h..]);
        for j in 0..4 {
            let bits = _mm256_and_si256(
                _mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j as i32)),
                _mm256_set1_epi8(3),
            );
            let u = _mm256_or_si256(bits, third(h, j));
            let sb = 8 * h + 2 * j;
            let y = load_i8(&x.qs[128 * h + 32 * j..]);
            acc = _mm256_add_epi32(acc, scaled(u, y, scale(sb), scale(sb + 1)));
        }
    }
    acc
}

/// Q2_K: 4-bit scales and mins; the mins go through the activation sums.
impl KBlock for BlockQ2K {
    #[inline(always)]
    unsafe fn block(&self, x: &BlockQ8K) -> (__m256i, i32) {
        let sums = two_bit_sums(
            &self.qs,
            x,
            |_, _| _mm256_setzero_si256(),
            |sb| (self.scales[sb] & 0x0F) as i16,
        );
        let mins: i32 = (0..16)
            .map(|sb| (self.scales[sb] >> 4) as i32 * x.bsums[sb] as i32)
            .sum();
        (sums, mins)
    }
}

/// Q3_K: `q - 4 * !hbit` is `u - 4` with `u = q + 4 * hbit` in 0..8: `maddubs` takes `u`,
/// and the `-4` comes out through the activation sums.
impl KBlock for BlockQ3K {
    #[inline(always)]
    unsafe fn block(&self, x: &BlockQ8K) -> (__m256i, i32) {
        let s = self.sub_scales();
        let hm = load(&self.hmask);
        let sums = two_bit_sums(
            &self.qs,
            x,
            |h, j| {
                let bit = _mm256_srl_epi16(hm, _mm_cvtsi32_si128((4 * h + j) as i32));
                _mm256_slli_epi16(_mm256_and_si256(bit, _mm256_set1_epi8(1)), 2)
            },
            |sb| s[sb] as i16,
        );
        let offset: i32 = (0..16).map(|sb| s[sb] * x.bsums[sb] as i32).sum();
        (sums, offset)
    }
}

/// IQ4_XS: 8 sub-blocks of 32 signed table levels, each with a signed 6-bit scale. The
/// levels are signed, so `maddubs` takes their magnitudes with the signs moved onto the
/// activations (as for Q8_0).
impl KBlock for BlockIQ4XS {
    #[inline(always)]
    unsafe fn block(&self, x: &BlockQ8K) -> (__m256i, i32) {
        let mut acc = _mm256_setzero_si256();
        for ib in 0..8 {
            let qs: &[u8; 16] = self.qs[16 * ib..16 * ib + 16].try_into().unwrap_unchecked();
            let w = iq4nl_values(qs);
            let y = load_i8(&x.qs[32 * ib..]);
            let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w));
            let sc = _mm256_set1_epi16(self.scale(ib) as i16);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
        }
        (acc, 0)
    }
}

/// Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins.
#[inline(always)]
unsafe fn k4_like(
    qs: &[u8; 128],
    qh: Option<&[u8; 32]>,
    scales: &[u8; 12],
    x: &BlockQ8K,
) -> (__m256i, i32) {
    let low4 = _mm256_set1_epi8(0x0F);
    let hbits = qh.map(|h| load(h));
    let mut acc = _mm256_setzero_si256();
    let mut mins = 0i32;
    for j in 0..4 {
        let (sc0, m0) = scale_min_k4(2 * j, scales);
        let (sc1, m1) = scale_min_k4(2 * j + 1, scales);
        let q = load(&qs[32 * j..]);
        let mut lo = _mm256_and_si256(q, low4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
        if let Some(h) = hbits {
            lo = _mm256_or_si256(lo, high_bits(h, 2 * j as i32, 1));
            hi = _mm256_or_si256(hi, high_bits(h, 2 * j as i32 + 1, 1));
        }
        let x0 = load_i8(&x.qs[64 * j..]);
        let x1 = load_i8(&x.qs[64 * j + 32..]);
        acc = _mm256_add_epi32(acc, scaled(lo, x0, sc0 as i16, sc0 as i16));
        acc = _mm256_add_epi32(acc, scaled(hi, x1, sc1 as i16, sc1 as i16));
        let b = &x.bsums[4 * j..4 * j + 4];
        mins += m0 as i32 * (b[0] as i32 + b[1] as i32) + m1 as i32 * (b[2] as i32 + b[3] as i32);
    }
    (acc, mins)
}

impl KBlock for BlockQ4K {
    #[inline(always)]
    unsafe fn block(&self, x: &BlockQ8K) -> (__m256i, i32) {
        k4_like(&self.qs, None, &self.scales, x)
    }
}

impl KBlock for BlockQ5K {
    #[inline(always)]
    unsafe fn block(&self, x: &BlockQ8K) -> (__m256i, i32) {
        k4_like(&self.qs, Some(&self.qh), &self.scales, x)
    }
}

impl KBlock for BlockQ6K {
    /// Two halves of 128; in each, four quarters of 32 (low/high nibbles of `ql`, 2-bit pairs of
    /// `qh`), each quarter two sub-blocks of 16 with their own int8 scale.
    #[inline(always)]
    unsafe fn block(&self, x: &BlockQ8K) -> (__m256i, i32) {
        let low4 = _mm256_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_si256();
        for half in 0..2 {
            let ql0 = load(&self.ql[64 * half..]);
            let ql1 = load(&self.ql[64 * half + 32..]);
            let qh = load(&self.qh[32 * half..]);
            let quarters = [
                _mm256_and_si256(ql0, low4),
                _mm256_and_si256(ql1, low4),
                _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
            ];
            for (k, low) in quarters.into_iter().enumerate() {
                let q = _mm256_or_si256(low, high_bits(qh, 2 * k as i32, 3));
                let xq = load_i8(&x.qs[128 * half + 32 * k..]);
                let s = 8 * half + 2 * k;
                acc = _mm256_add_epi32(
                    acc,
                    scaled(q, xq, self.scales[s] as i16, self.scales[s + 1] as i16),
                );
            }
        }
        let offset: i32 = self
            .scales
            .iter()
            .zip(&x.bsums)
            .map(|(&s, &b)| s as i32 * b as i32)
            .sum();
        (acc, offset)
    }
}
