//! AVX2 kernels over interleaved k-quant groups (`crate::packed::kquant`): lane `r` is row `r`.
//! Per sub-block, the byte products of eight rows accumulate in one vector ([`ByteDot::acc`]:
//! i16 pairs with `maddubs`, finished by a `madd` with the rows' scales before they could
//! overflow; i32 with VNNI, finished by a multiply), so a sub-block costs one scale operation
//! for eight rows instead of one per row, and no horizontal sums are needed.
//!
//! # Safety
//! Every `unsafe fn` here executes x86 SIMD instructions: call it only on a CPU with the
//! features its `#[target_feature]` entry point enables (a `KernelSet` of a tier hands these
//! out only after `Tier::is_supported`). Slices are read within their bounds; raw pointers
//! point into blocks the caller passed, at offsets the block layout defines.

use super::x86::{bcast4, fifth, Avx512Vnni, AvxVnni, ByteDot, Flavour, Maddubs, PREFETCH};
use crate::packed::{bsum32_pairs, group_layout, GroupLayout, Rows8KFn, GROUP_ROWS};
use crate::quant::BlockQ8K;
use crate::QuantType;
use std::arch::x86_64::*;

/// 16 bytes of scale (or minimum) pairs widened to i16: lane `r` = row `r`'s pair.
#[inline(always)]
unsafe fn pairs(p: *const u8, signed: bool) -> __m256i {
    let raw = _mm_loadu_si128(p as *const __m128i);
    if signed {
        _mm256_cvtepi8_epi16(raw)
    } else {
        _mm256_cvtepu8_epi16(raw)
    }
}

/// Each lane's first i16 in both halves.
#[inline(always)]
unsafe fn dup_first(v: __m256i) -> __m256i {
    _mm256_blend_epi16::<0xAA>(v, _mm256_slli_epi32::<16>(v))
}

/// Each lane's second i16 in both halves.
#[inline(always)]
unsafe fn dup_second(v: __m256i) -> __m256i {
    _mm256_blend_epi16::<0x55>(v, _mm256_srli_epi32::<16>(v))
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// Q4_K and Q5_K: integer sums `d`-scaled (`isum`) and minimum sums (`msum`) per token.
#[inline(always)]
unsafe fn k4_sums<D: ByteDot, const T: usize, const FIVE: bool>(
    grp: *const u8,
    l: &GroupLayout,
    x: [&BlockQ8K; T],
) -> ([__m256i; T], [__m256i; T]) {
    let low4 = _mm256_set1_epi8(0x0F);
    let (sc_at, mn_at) = (l.sc.unwrap_or(0), l.mn.unwrap_or(0));
    let mut isum = [_mm256_setzero_si256(); T];
    let mut msum = [_mm256_setzero_si256(); T];
    let y: [*const i8; T] = std::array::from_fn(|t| x[t].qs.as_ptr());
    // Q5_K's i16 accumulators hold four products of 31 x 127 pairs; Q4_K's all eight.
    let per_finish = if FIVE { 4 } else { 8 };
    for j in 0..4 {
        let scp = pairs(grp.add(sc_at + 16 * j), false);
        let (sc_lo, sc_hi) = (dup_first(scp), dup_second(scp));
        let mut alo = [_mm256_setzero_si256(); T];
        let mut ahi = [_mm256_setzero_si256(); T];
        for c in 0..8 {
            let v = load(grp.add(l.qs + 32 * (8 * j + c)));
            let mut lo = _mm256_and_si256(v, low4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            if FIVE {
                let h = load(grp.add(l.qh.unwrap_or(0) + 32 * c));
                lo = _mm256_or_si256(lo, fifth(h, 2 * j as i32));
                hi = _mm256_or_si256(hi, fifth(h, 2 * j as i32 + 1));
            }
            for t in 0..T {
                alo[t] = D::acc(alo[t], lo, bcast4(y[t], 64 * j + 4 * c));
                ahi[t] = D::acc(ahi[t], hi, bcast4(y[t], 64 * j + 32 + 4 * c));
            }
            if (c + 1) % per_finish == 0 {
                for t in 0..T {
                    isum[t] = D::finish(isum[t], alo[t], sc_lo);
                    isum[t] = D::finish(isum[t], ahi[t], sc_hi);
                    alo[t] = _mm256_setzero_si256();
                    ahi[t] = _mm256_setzero_si256();
                }
            }
        }
        let mnp = pairs(grp.add(mn_at + 16 * j), false);
        for t in 0..T {
            let b = _mm256_set1_epi32(bsum32_pairs(x[t])[j]);
            msum[t] = _mm256_add_epi32(msum[t], _mm256_madd_epi16(mnp, b));
        }
    }
    (isum, msum)
}

/// Q6_K: integer sums with the `-32` offset taken out, per token.
#[inline(always)]
unsafe fn k6_sums<D: ByteDot, const T: usize>(
    grp: *const u8,
    l: &GroupLayout,
    x: [&BlockQ8K; T],
) -> [__m256i; T] {
    let low4 = _mm256_set1_epi8(0x0F);
    let mask = _mm256_set1_epi8(0x30);
    let (sc_at, qh_at) = (l.sc.unwrap_or(0), l.qh.unwrap_or(0));
    let mut isum = [_mm256_setzero_si256(); T];
    let y: [*const i8; T] = std::array::from_fn(|t| x[t].qs.as_ptr());
    for n in 0..2 {
        for a in 0..2 {
            // Low nibbles: sub-blocks 8n + 2a + {0, 1}; high: 8n + 4 + 2a + {0, 1}; one scale
            // pair each.
            let scl = pairs(grp.add(sc_at + 16 * (4 * n + a)), true);
            let sch = pairs(grp.add(sc_at + 16 * (4 * n + a + 2)), true);
            let scs = [
                [dup_first(scl), dup_second(scl)],
                [dup_first(sch), dup_second(sch)],
            ];
            let mut acc = [[_mm256_setzero_si256(); 2]; T];
            for c in 0..8 {
                let v = load(grp.add(l.qs + 32 * (8 * (2 * n + a) + c)));
                let h = load(grp.add(qh_at + 32 * (8 * n + c)));
                // qh bits (2a, 2a + 1) go with the low nibble, (4 + 2a, 5 + 2a) with the high
                // one; both move to bits 4 and 5.
                let (hl, hh) = if a == 0 {
                    (_mm256_slli_epi16::<4>(h), h)
                } else {
                    (_mm256_slli_epi16::<2>(h), _mm256_srli_epi16::<2>(h))
                };
                let ql = _mm256_or_si256(_mm256_and_si256(v, low4), _mm256_and_si256(hl, mask));
                let qhi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4);
                let qhi = _mm256_or_si256(qhi, _mm256_and_si256(hh, mask));
                let e = 128 * n + 32 * a + 4 * c;
                for t in 0..T {
                    acc[t][0] = D::acc(acc[t][0], ql, bcast4(y[t], e));
                    acc[t][1] = D::acc(acc[t][1], qhi, bcast4(y[t], e + 64));
                }
                // Two products of 63 x 127 pairs fill an i16; columns c / 4 = sub-block.
                if c % 2 == 1 {
                    for t in 0..T {
                        for high in 0..2 {
                            isum[t] = D::finish(isum[t], acc[t][high], scs[high][c / 4]);
                            acc[t][high] = _mm256_setzero_si256();
                        }
                    }
                }
            }
        }
    }
    for p in 0..8 {
        let scp = pairs(grp.add(sc_at + 16 * p), true);
        for t in 0..T {
            let b = std::ptr::read_unaligned(x[t].bsums.as_ptr().add(2 * p) as *const i32);
            let off = _mm256_madd_epi16(scp, _mm256_set1_epi32(b));
            isum[t] = _mm256_sub_epi32(isum[t], _mm256_slli_epi32::<5>(off));
        }
    }
    isum
}

#[inline(always)]
unsafe fn rows8k_body<D: ByteDot, const T: usize>(
    ty: QuantType,
    groups: &[u8],
    x: [&[BlockQ8K]; T],
) -> [__m256; T] {
    let l = group_layout(ty).expect("packable type");
    let nb = groups.len() / l.bytes;
    for xt in x {
        assert!(xt.len() >= nb);
    }
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        let grp = groups.as_ptr().add(b * l.bytes);
        // Two groups ahead: a k-quant group is 1.2-1.7 KB.
        let mut line = 0;
        while line < l.bytes {
            _mm_prefetch::<_MM_HINT_T0>(grp.wrapping_add(PREFETCH + line) as *const i8);
            line += 64;
        }
        let xb: [&BlockQ8K; T] = std::array::from_fn(|t| x[t].get_unchecked(b));
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(grp as *const __m128i));
        if ty == QuantType::Q6_K {
            let isum = k6_sums::<D, T>(grp, &l, xb);
            for t in 0..T {
                // `crate::quant::term::scaled`, lane by lane.
                let d = _mm256_mul_ps(dw, _mm256_set1_ps(xb[t].d));
                acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum[t])));
            }
            continue;
        }
        let (isum, msum) = if ty == QuantType::Q5_K {
            k4_sums::<D, T, true>(grp, &l, xb)
        } else {
            k4_sums::<D, T, false>(grp, &l, xb)
        };
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(
            grp.add(l.dmin.unwrap_or(0)) as *const __m128i
        ));
        for t in 0..T {
            // `crate::quant::term::k_min`, lane by lane: dx * (d * sums - dmin * mins).
            let scaled = _mm256_mul_ps(dw, _mm256_cvtepi32_ps(isum[t]));
            let mins = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(msum[t]));
            let term = _mm256_mul_ps(_mm256_set1_ps(xb[t].d), _mm256_sub_ps(scaled, mins));
            acc[t] = _mm256_add_ps(acc[t], term);
        }
    }
    acc
}

#[inline(always)]
unsafe fn rows8k_n<D: ByteDot>(
    ty: QuantType,
    g: &[u8],
    x: [&[BlockQ8K]; 4],
    n: usize,
    out: &mut [[f32; GROUP_ROWS]; 4],
) {
    macro_rules! run {
        ($t:literal) => {{
            let acc = rows8k_body::<D, $t>(ty, g, std::array::from_fn(|i| x[i]));
            for (o, a) in out.iter_mut().zip(acc) {
                _mm256_storeu_ps(o.as_mut_ptr(), a);
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
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows8k_avx2<const TY: u32>(
    g: &[u8],
    x: [&[BlockQ8K]; 4],
    n: usize,
    out: &mut [[f32; GROUP_ROWS]; 4],
) {
    let ty = QuantType::from_ggml_id(TY).expect("k-quant id");
    rows8k_n::<Maddubs>(ty, g, x, n, out)
}

/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn rows8k_avxvnni<const TY: u32>(
    g: &[u8],
    x: [&[BlockQ8K]; 4],
    n: usize,
    out: &mut [[f32; GROUP_ROWS]; 4],
) {
    let ty = QuantType::from_ggml_id(TY).expect("k-quant id");
    rows8k_n::<AvxVnni>(ty, g, x, n, out)
}

/// # Safety
/// The CPU must support AVX2, FMA, F16C, AVX-512 F/VL and AVX512-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn rows8k_avx512vnni<const TY: u32>(
    g: &[u8],
    x: [&[BlockQ8K]; 4],
    n: usize,
    out: &mut [[f32; GROUP_ROWS]; 4],
) {
    let ty = QuantType::from_ggml_id(TY).expect("k-quant id");
    rows8k_n::<Avx512Vnni>(ty, g, x, n, out)
}

/// The interleaved k-quant kernel of the type with GGML id `TY` for `flavour`.
pub(super) fn rows8k<const TY: u32>(flavour: Flavour) -> Rows8KFn {
    match flavour {
        Flavour::Avx2 => |g, x, n, out| unsafe { rows8k_avx2::<TY>(g, x, n, out) },
        Flavour::AvxVnni => |g, x, n, out| unsafe { rows8k_avxvnni::<TY>(g, x, n, out) },
        Flavour::Avx512Vnni => |g, x, n, out| unsafe { rows8k_avx512vnni::<TY>(g, x, n, out) },
    }
}
