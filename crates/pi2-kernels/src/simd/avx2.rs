//! AVX2 + FMA + F16C kernels. Integer products use `maddubs` (u8 x i8 -> i16 pairs); signed
//! weights go through the sign trick (|w| times sign(w)*x). Activations never hold -128, so the
//! sign flip cannot overflow. The 4-row kernels keep one accumulator chain per row so loads of
//! four weight streams overlap, and load each activation block once.
//!
//! # Safety
//! Every `unsafe fn` here executes x86 SIMD instructions: call it only on a CPU with the
//! features its `#[target_feature]` entry point enables (a `KernelSet` of a tier hands these
//! out only after `Tier::is_supported`). Slices are read within their bounds; raw pointers
//! point into blocks the caller passed, at offsets the block layout defines.

use super::avx2_x8::rows8;
use super::x86::{
    f16_scalar, hsum_epi32, hsum_ps, hsums4, iq4nl_values, mxfp4_values, nibbles, Avx512Vnni,
    AvxVnni, ByteDot, Flavour, Maddubs, PREFETCH,
};
use super::{KernelSet, RowKernels};
use crate::quant::{
    term, BlockIQ4NL, BlockMXFP4, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8, BlockQ8_0,
};
use std::arch::x86_64::*;

/// The AVX2 set; `tier` `AvxVnni` swaps in `vpdpbusd` where a kernel has a VNNI form.
pub(super) fn kernel_set(tier: super::Tier) -> KernelSet {
    let flavour = if tier == super::Tier::AvxVnni {
        Flavour::AvxVnni
    } else {
        Flavour::Avx2
    };
    KernelSet {
        tier,
        f32: |w, x| unsafe { dot_f32(w, x) },
        f16: |w, x| unsafe { dot_f16(w, x) },
        axpy_f16: |a, x, y| unsafe { axpy_f16(a, x, y) },
        bf16: |w, x| unsafe { dot_bf16(w, x) },
        axpy_bf16: |a, x, y| unsafe { axpy_bf16(a, x, y) },
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
        q4_k: super::avx2_k::rows(),
        q5_k: super::avx2_k::rows(),
        q6_k: super::avx2_k::rows(),
        x8: x8_kernels(flavour),
    }
}

/// The interleaved-group kernels with `flavour`'s byte products.
pub(super) fn x8_kernels(flavour: Flavour) -> super::X8Kernels {
    super::X8Kernels {
        q4_0: rows8::<BlockQ4_0>(flavour),
        q4_1: rows8::<BlockQ4_1>(flavour),
        q5_0: rows8::<BlockQ5_0>(flavour),
        q5_1: rows8::<BlockQ5_1>(flavour),
        q8_0: rows8::<BlockQ8_0>(flavour),
        q4_k: super::avx2_x8k::rows8k::<12>(flavour),
        q5_k: super::avx2_x8k::rows8k::<13>(flavour),
        q6_k: super::avx2_x8k::rows8k::<14>(flavour),
        fast: true,
    }
}

/// The row kernels of a 32-element block type, all from the one `tile` body, with
/// `flavour`'s byte products.
pub(super) fn tiles<B: Block32 + crate::quant::QuantBlock<Act = BlockQ8>>(
    flavour: Flavour,
) -> RowKernels<B> {
    let axpy = |w: &[B], a, y: &mut [f32]| unsafe { axpy::<B>(w, a, y) };
    match flavour {
        Flavour::Avx2 => RowKernels {
            dot: |w, x| unsafe { tile_avx2::<B, 1, 1>([w], [x])[0][0] },
            dot4: |w, x| unsafe { tile_avx2::<B, 4, 1>(w, [x]).map(|r| r[0]) },
            dot4x2: |w, x| unsafe { tile_avx2::<B, 4, 2>(w, x) },
            axpy,
        },
        Flavour::AvxVnni => RowKernels {
            dot: |w, x| unsafe { tile_avxvnni::<B, 1, 1>([w], [x])[0][0] },
            dot4: |w, x| unsafe { tile_avxvnni::<B, 4, 1>(w, [x]).map(|r| r[0]) },
            dot4x2: |w, x| unsafe { tile_avxvnni::<B, 4, 2>(w, x) },
            axpy,
        },
        Flavour::Avx512Vnni => RowKernels {
            dot: |w, x| unsafe { tile_avx512vnni::<B, 1, 1>([w], [x])[0][0] },
            dot4: |w, x| unsafe { tile_avx512vnni::<B, 4, 1>(w, [x]).map(|r| r[0]) },
            dot4x2: |w, x| unsafe { tile_avx512vnni::<B, 4, 2>(w, x) },
            axpy,
        },
    }
}

/// A 32-element weight block as the AVX2 kernels see it.
pub(super) trait Block32: Copy {
    /// Per-activation-block work shared by every row (e.g. the sum of the activations).
    type Shared: Copy;
    unsafe fn shared<D: ByteDot>(y: __m256i) -> Self::Shared;
    /// Exact integer dot product with the activation block, as 8 i32 lanes.
    unsafe fn idot<D: ByteDot>(&self, y: __m256i, shared: Self::Shared) -> __m256i;
    unsafe fn scale(&self) -> f32;
    /// The min (Q4_1, Q5_1: `w = q * d + m`), `None` for symmetric formats.
    unsafe fn min(&self) -> Option<f32>;
    /// The block as `q * scale` (plus the min) with `q` the 32 signed bytes, for axpy.
    unsafe fn values(&self) -> (__m256i, f32);
    /// This block's share of a row's dot product from its exact integer sum with `x`: the
    /// formula of `crate::quant::term` every tier uses.
    #[inline(always)]
    unsafe fn term(&self, x: &BlockQ8, isum: i32) -> f32 {
        match self.min() {
            Some(m) => term::with_min(self.scale(), x.d, isum, m, x.s),
            None => term::scaled(self.scale(), x.d, isum),
        }
    }
}

impl Block32 for BlockQ4_0 {
    type Shared = __m256i;
    /// sum(y) per 32-bit lane, for the -8 offset: (q - 8) . y = q . y - 8 sum(y).
    #[inline(always)]
    unsafe fn shared<D: ByteDot>(y: __m256i) -> __m256i {
        D::udot(_mm256_setzero_si256(), _mm256_set1_epi8(1), y)
    }
    #[inline(always)]
    unsafe fn idot<D: ByteDot>(&self, y: __m256i, sum_y: __m256i) -> __m256i {
        let q = D::udot(_mm256_setzero_si256(), nibbles(&self.qs), y);
        _mm256_sub_epi32(q, _mm256_slli_epi32(sum_y, 3))
    }
    #[inline(always)]
    unsafe fn scale(&self) -> f32 {
        f16_scalar(self.d)
    }
    #[inline(always)]
    unsafe fn min(&self) -> Option<f32> {
        None
    }
    #[inline(always)]
    unsafe fn values(&self) -> (__m256i, f32) {
        let q = _mm256_sub_epi8(nibbles(&self.qs), _mm256_set1_epi8(8));
        (q, f16_scalar(self.d))
    }
}

impl Block32 for BlockQ4_1 {
    type Shared = ();
    #[inline(always)]
    unsafe fn shared<D: ByteDot>(_: __m256i) {}
    #[inline(always)]
    unsafe fn idot<D: ByteDot>(&self, y: __m256i, _: ()) -> __m256i {
        D::udot(_mm256_setzero_si256(), nibbles(&self.qs), y)
    }
    #[inline(always)]
    unsafe fn scale(&self) -> f32 {
        f16_scalar(self.d)
    }
    #[inline(always)]
    unsafe fn min(&self) -> Option<f32> {
        Some(f16_scalar(self.m))
    }
    #[inline(always)]
    unsafe fn values(&self) -> (__m256i, f32) {
        (nibbles(&self.qs), f16_scalar(self.d))
    }
}

/// `w . y` for signed `w`: its magnitudes times `y` with the signs of `w` moved onto `y`.
#[inline(always)]
unsafe fn signed_dot<D: ByteDot>(w: __m256i, y: __m256i) -> __m256i {
    D::udot(
        _mm256_setzero_si256(),
        _mm256_sign_epi8(w, w),
        _mm256_sign_epi8(y, w),
    )
}

impl Block32 for BlockIQ4NL {
    type Shared = ();
    #[inline(always)]
    unsafe fn shared<D: ByteDot>(_: __m256i) {}
    #[inline(always)]
    unsafe fn idot<D: ByteDot>(&self, y: __m256i, _: ()) -> __m256i {
        signed_dot::<D>(iq4nl_values(&self.qs), y)
    }
    #[inline(always)]
    unsafe fn scale(&self) -> f32 {
        f16_scalar(self.d)
    }
    #[inline(always)]
    unsafe fn min(&self) -> Option<f32> {
        None
    }
    #[inline(always)]
    unsafe fn values(&self) -> (__m256i, f32) {
        (iq4nl_values(&self.qs), f16_scalar(self.d))
    }
}

/// MXFP4: IQ4_NL's form with E2M1 values and a power-of-two scale (so the product of the scales
/// is exact and the sum equals the scalar reference's).
impl Block32 for BlockMXFP4 {
    type Shared = ();
    #[inline(always)]
    unsafe fn shared<D: ByteDot>(_: __m256i) {}
    #[inline(always)]
    unsafe fn idot<D: ByteDot>(&self, y: __m256i, _: ()) -> __m256i {
        signed_dot::<D>(mxfp4_values(&self.qs), y)
    }
    #[inline(always)]
    unsafe fn scale(&self) -> f32 {
        crate::quant::mxfp4::e8m0_half(self.e)
    }
    #[inline(always)]
    unsafe fn min(&self) -> Option<f32> {
        None
    }
    #[inline(always)]
    unsafe fn values(&self) -> (__m256i, f32) {
        (mxfp4_values(&self.qs), self.scale())
    }
}

/// 0x10 in byte `k` where bit `k` of the little-endian `qh` is set: the fifth bits of a Q5
/// block, element order (matching [`nibbles`]).
#[inline(always)]
pub(super) unsafe fn fifth_bits(qh: [u8; 4]) -> __m256i {
    let v = _mm256_set1_epi32(u32::from_le_bytes(qh) as i32);
    // Byte k takes byte k / 8 of qh (every 32-bit lane holds all four, so the in-lane shuffle
    // of the high half finds bytes 2 and 3 too), then tests bit k % 8.
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, spread), bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The 32 five-bit values of a Q5 block as bytes, element order.
#[inline(always)]
unsafe fn fives(qh: [u8; 4], qs: &[u8; 16]) -> __m256i {
    _mm256_or_si256(nibbles(qs), fifth_bits(qh))
}

impl Block32 for BlockQ5_0 {
    type Shared = __m256i;
    /// sum(y) per 32-bit lane, for the -16 offset: (q - 16) . y = q . y - 16 sum(y).
    #[inline(always)]
    unsafe fn shared<D: ByteDot>(y: __m256i) -> __m256i {
        D::udot(_mm256_setzero_si256(), _mm256_set1_epi8(1), y)
    }
    #[inline(always)]
    unsafe fn idot<D: ByteDot>(&self, y: __m256i, sum_y: __m256i) -> __m256i {
        let q = D::udot(_mm256_setzero_si256(), fives(self.qh, &self.qs), y);
        _mm256_sub_epi32(q, _mm256_slli_epi32(sum_y, 4))
    }
    #[inline(always)]
    unsafe fn scale(&self) -> f32 {
        f16_scalar(self.d)
    }
    #[inline(always)]
    unsafe fn min(&self) -> Option<f32> {
        None
    }
    #[inline(always)]
    unsafe fn values(&self) -> (__m256i, f32) {
        let q = _mm256_sub_epi8(fives(self.qh, &self.qs), _mm256_set1_epi8(16));
        (q, f16_scalar(self.d))
    }
}

impl Block32 for BlockQ5_1 {
    type Shared = ();
    #[inline(always)]
    unsafe fn shared<D: ByteDot>(_: __m256i) {}
    #[inline(always)]
    unsafe fn idot<D: ByteDot>(&self, y: __m256i, _: ()) -> __m256i {
        D::udot(_mm256_setzero_si256(), fives(self.qh, &self.qs), y)
    }
    #[inline(always)]
    unsafe fn scale(&self) -> f32 {
        f16_scalar(self.d)
    }
    #[inline(always)]
    unsafe fn min(&self) -> Option<f32> {
        Some(f16_scalar(self.m))
    }
    #[inline(always)]
    unsafe fn values(&self) -> (__m256i, f32) {
        (fives(self.qh, &self.qs), f16_scalar(self.d))
    }
}

impl Block32 for BlockQ8_0 {
    type Shared = ();
    #[inline(always)]
    unsafe fn shared<D: ByteDot>(_: __m256i) {}
    #[inline(always)]
    unsafe fn idot<D: ByteDot>(&self, y: __m256i, _: ()) -> __m256i {
        signed_dot::<D>(_mm256_loadu_si256(self.qs.as_ptr() as *const __m256i), y)
    }
    #[inline(always)]
    unsafe fn scale(&self) -> f32 {
        f16_scalar(self.d)
    }
    #[inline(always)]
    unsafe fn min(&self) -> Option<f32> {
        None
    }
    #[inline(always)]
    unsafe fn values(&self) -> (__m256i, f32) {
        let q = _mm256_loadu_si256(self.qs.as_ptr() as *const __m256i);
        (q, f16_scalar(self.d))
    }
}

/// `y += a * row`: each block's 32 bytes widen to four 8-lane f32 vectors, dequantized as the
/// format's `dequantize` does (`q * d`, plus the min), then `y + a * w` (no fused multiply-add:
/// the reference's rounding on every tier).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy<B: Block32>(w: &[B], a: f32, y: &mut [f32]) {
    assert!(y.len() >= w.len() * 32, "axpy: output shorter than the row");
    let av = _mm256_set1_ps(a);
    for (bi, b) in w.iter().enumerate() {
        let (q, d) = b.values();
        let (dv, min) = (_mm256_set1_ps(d), b.min().map(|m| _mm256_set1_ps(m)));
        let (lo, hi) = (_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
        let parts = [lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)];
        let yp = y.as_mut_ptr().add(bi * 32);
        for (k, part) in parts.into_iter().enumerate() {
            let mut v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part)), dv);
            if let Some(m) = min {
                v = _mm256_add_ps(v, m);
            }
            let p = yp.add(k * 8);
            _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), _mm256_mul_ps(av, v)));
        }
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<B: Block32, const R: usize, const T: usize>(
    w: [&[B]; R],
    x: [&[BlockQ8]; T],
) -> [[f32; T]; R] {
    tile::<B, Maddubs, R, T>(w, x)
}

/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn tile_avxvnni<B: Block32, const R: usize, const T: usize>(
    w: [&[B]; R],
    x: [&[BlockQ8]; T],
) -> [[f32; T]; R] {
    tile::<B, AvxVnni, R, T>(w, x)
}

/// # Safety
/// The CPU must support AVX2, FMA, F16C, AVX-512 F/VL and AVX512-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn tile_avx512vnni<B: Block32, const R: usize, const T: usize>(
    w: [&[B]; R],
    x: [&[BlockQ8]; T],
) -> [[f32; T]; R] {
    tile::<B, Avx512Vnni, R, T>(w, x)
}

/// `R` rows of blocks against `T` activation rows: each weight block is unpacked once per tile
/// and each activation block loaded once. Each (row, token) block's integer sum is made exact
/// (lanes added as integers) and added to its output as the block's `term`, in block order: the
/// scalar reference's value, bit for bit.
///
/// # Safety
/// Called from an entry point that enables AVX2, FMA, F16C and what `D` needs. Only the common
/// prefix of all rows is read.
#[inline(always)]
unsafe fn tile<B: Block32, D: ByteDot, const R: usize, const T: usize>(
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
        let mut y = [_mm256_setzero_si256(); T];
        let mut shared = [B::shared::<D>(_mm256_setzero_si256()); T];
        for t in 0..T {
            y[t] = _mm256_loadu_si256(x[t].get_unchecked(i).qs.as_ptr() as *const __m256i);
            shared[t] = B::shared::<D>(y[t]);
        }
        let mut lanes = [[_mm256_setzero_si256(); T]; R];
        for r in 0..R {
            let wb = w[r].get_unchecked(i);
            // The hardware prefetcher alone leaves decode latency-bound on weights streamed
            // from DRAM; ask for the lines PREFETCH bytes ahead (past the row end is harmless).
            _mm_prefetch::<_MM_HINT_T0>((wb as *const B as *const i8).wrapping_add(PREFETCH));
            for t in 0..T {
                lanes[r][t] = wb.idot::<D>(y[t], shared[t]);
            }
        }
        let isum = exact_sums(lanes);
        for r in 0..R {
            let wb = w[r].get_unchecked(i);
            for t in 0..T {
                out[r][t] += wb.term(x[t].get_unchecked(i), isum[r][t]);
            }
        }
    }
    out
}

/// The integer sum of each vector's eight lanes (exact: integer adds in any order), four rows
/// at a time through `hadd` when there are four.
#[inline(always)]
unsafe fn exact_sums<const R: usize, const T: usize>(v: [[__m256i; T]; R]) -> [[i32; T]; R] {
    let mut out = [[0i32; T]; R];
    if R == 4 {
        for t in 0..T {
            let four: [__m256i; 4] = std::array::from_fn(|r| v[r % R][t]);
            let mut sums = [0i32; 4];
            _mm_storeu_si128(sums.as_mut_ptr() as *mut __m128i, hsums4(four));
            for r in 0..R {
                out[r][t] = sums[r % 4];
            }
        }
    } else {
        for r in 0..R {
            for t in 0..T {
                out[r][t] = hsum_epi32(v[r][t]);
            }
        }
    }
    out
}

/// A float dot product in the canonical order (`crate::quant::float_order`): lanes 0..8 of each
/// 16-element chunk in `a0`, 8..16 in `a1`, multiply then add; `a0 + a1` then `hsum_ps` is the
/// reference's lane fold.
///
/// # Safety
/// The CPU must support AVX2 (and what `load` needs); `load(i)` reads 8 values at element `i`.
#[inline(always)]
unsafe fn dot_canonical(n: usize, load: impl Fn(usize) -> __m256, x: &[f32]) -> f32 {
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i + 16 <= n {
        let p0 = _mm256_mul_ps(load(i), _mm256_loadu_ps(x.as_ptr().add(i)));
        let p1 = _mm256_mul_ps(load(i + 8), _mm256_loadu_ps(x.as_ptr().add(i + 8)));
        a0 = _mm256_add_ps(a0, p0);
        a1 = _mm256_add_ps(a1, p1);
        i += 16;
    }
    hsum_ps(_mm256_add_ps(a0, a1))
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let mut s = dot_canonical(n, |i| _mm256_loadu_ps(w.as_ptr().add(i)), x);
    for i in n / 16 * 16..n {
        s += w[i] * x[i];
    }
    s
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_f16(w: &[u16], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let load = |i: usize| _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().add(i) as *const __m128i));
    let mut s = dot_canonical(n, load, x);
    for i in n / 16 * 16..n {
        s += f16_scalar(w[i]) * x[i];
    }
    s
}

/// Eight BF16 values at `p` as f32 (a widening shift: exact).
///
/// # Safety
/// AVX2; eight `u16` readable at `p`.
#[target_feature(enable = "avx2")]
unsafe fn load_bf16x8(p: *const u16) -> __m256 {
    let h = _mm_loadu_si128(p as *const __m128i);
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let mut s = dot_canonical(n, |i| load_bf16x8(w.as_ptr().add(i)), x);
    for i in n / 16 * 16..n {
        s += crate::quant::bf16::bf16_to_f32(w[i]) * x[i];
    }
    s
}

/// `y += a * x` over 8-lane chunks, `load(i)` giving `x[i..i + 8]` as f32: multiply then add,
/// the reference's rounding.
///
/// # Safety
/// The CPU must support AVX2 (and what `load` needs); `y` holds at least `n` values.
#[inline(always)]
unsafe fn axpy_chunks(a: f32, n: usize, load: impl Fn(usize) -> __m256, y: &mut [f32]) {
    let av = _mm256_set1_ps(a);
    let mut i = 0;
    while i + 8 <= n {
        let yp = y.as_mut_ptr().add(i);
        _mm256_storeu_ps(
            yp,
            _mm256_add_ps(_mm256_loadu_ps(yp), _mm256_mul_ps(av, load(i))),
        );
        i += 8;
    }
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn axpy_bf16(a: f32, x: &[u16], y: &mut [f32]) {
    let n = x.len().min(y.len());
    axpy_chunks(a, n, |i| load_bf16x8(x.as_ptr().add(i)), y);
    for i in n / 8 * 8..n {
        y[i] += a * crate::quant::bf16::bf16_to_f32(x[i]);
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn axpy_f16(a: f32, x: &[u16], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let load = |i: usize| _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i) as *const __m128i));
    axpy_chunks(a, n, load, y);
    for i in n / 8 * 8..n {
        y[i] += a * f16_scalar(x[i]);
    }
}
