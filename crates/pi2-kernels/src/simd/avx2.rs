//! AVX2 + FMA + F16C kernels. Integer products use `maddubs` (u8 x i8 -> i16 pairs); signed
//! weights go through the sign trick (|w| times sign(w)*x). Activations never hold -128, so the
//! sign flip cannot overflow.

use super::KernelSet;
use crate::quant::{self, BlockQ4_0, BlockQ4_1, BlockQ8, BlockQ8_0, QuantBlock};
use std::arch::x86_64::*;

pub(super) fn kernel_set() -> KernelSet {
    KernelSet {
        tier: super::Tier::Avx2,
        f32: |w, x| unsafe { dot_f32(w, x) },
        f16: |w, x| unsafe { dot_f16(w, x) },
        axpy_f16: |a, x, y| unsafe { axpy_f16(a, x, y) },
        q4_0: |w, x| unsafe { dot_q4_0(w, x) },
        q4_1: |w, x| unsafe { dot_q4_1(w, x) },
        q8_0: |w, x| unsafe { dot_q8_0(w, x) },
        // k-quants: the scalar reference until the kernels issue lands their SIMD paths.
        q4_k: quant::BlockQ4K::vec_dot_ref,
        q5_k: quant::BlockQ5K::vec_dot_ref,
        q6_k: quant::BlockQ6K::vec_dot_ref,
    }
}

#[inline(always)]
unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[inline(always)]
unsafe fn f16_scalar(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Sum of u8 x i8 products in 8 i32 lanes, as f32.
#[inline(always)]
unsafe fn mul_sum_us8(ax: __m256i, sy: __m256i) -> __m256 {
    let p16 = _mm256_maddubs_epi16(ax, sy);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
}

/// Sum of i8 x i8 products via the sign trick.
#[inline(always)]
unsafe fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256 {
    mul_sum_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// The 32 nibbles of a Q4 block as bytes: low nibbles (elements 0..16) then high (16..32).
#[inline(always)]
unsafe fn nibbles(qs: &[u8; 16]) -> __m256i {
    let tmp = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_0(w: &[BlockQ4_0], x: &[BlockQ8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (wb, xb) in w.iter().zip(x) {
        let wq = _mm256_sub_epi8(nibbles(&wb.qs), _mm256_set1_epi8(8));
        let y = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
        let d = _mm256_set1_ps(f16_scalar(wb.d) * xb.d);
        acc = _mm256_fmadd_ps(d, mul_sum_i8(wq, y), acc);
    }
    hsum_ps(acc)
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1(w: &[BlockQ4_1], x: &[BlockQ8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (wb, xb) in w.iter().zip(x) {
        let y = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
        let d = _mm256_set1_ps(f16_scalar(wb.d) * xb.d);
        acc = _mm256_fmadd_ps(d, mul_sum_us8(nibbles(&wb.qs), y), acc);
        mins += f16_scalar(wb.m) * xb.s;
    }
    hsum_ps(acc) + mins
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0(w: &[BlockQ8_0], x: &[BlockQ8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (wb, xb) in w.iter().zip(x) {
        let wq = _mm256_loadu_si256(wb.qs.as_ptr() as *const __m256i);
        let y = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
        let d = _mm256_set1_ps(f16_scalar(wb.d) * xb.d);
        acc = _mm256_fmadd_ps(d, mul_sum_i8(wq, y), acc);
    }
    hsum_ps(acc)
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i + 16 <= n {
        a0 = _mm256_fmadd_ps(
            _mm256_loadu_ps(w.as_ptr().add(i)),
            _mm256_loadu_ps(x.as_ptr().add(i)),
            a0,
        );
        a1 = _mm256_fmadd_ps(
            _mm256_loadu_ps(w.as_ptr().add(i + 8)),
            _mm256_loadu_ps(x.as_ptr().add(i + 8)),
            a1,
        );
        i += 16;
    }
    let mut s = hsum_ps(_mm256_add_ps(a0, a1));
    while i < n {
        s += w[i] * x[i];
        i += 1;
    }
    s
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16(w: &[u16], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(w.as_ptr().add(i) as *const __m128i);
        acc = _mm256_fmadd_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(x.as_ptr().add(i)), acc);
        i += 8;
    }
    let mut s = hsum_ps(acc);
    while i < n {
        s += f16_scalar(w[i]) * x[i];
        i += 1;
    }
    s
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_f16(a: f32, x: &[u16], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let av = _mm256_set1_ps(a);
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(x.as_ptr().add(i) as *const __m128i);
        let yp = y.as_mut_ptr().add(i);
        _mm256_storeu_ps(
            yp,
            _mm256_fmadd_ps(av, _mm256_cvtph_ps(h), _mm256_loadu_ps(yp)),
        );
        i += 8;
    }
    while i < n {
        y[i] += a * f16_scalar(x[i]);
        i += 1;
    }
}
