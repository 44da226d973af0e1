//! AVX2 kernels over row-interleaved groups (`crate::packed`): 32-bit lane `r` of every vector
//! belongs to row `r` of the group, so four broadcast activations serve eight rows, the eight
//! f16 scales convert in one `vcvtph2ps`, and the accumulator's lanes are the eight outputs.
//!
//! The byte products go through a [`ByteDot`]: `maddubs` + `madd` on AVX2, or `vpdpbusd` on
//! CPUs with AVX-VNNI (VEX) or AVX512-VNNI (EVEX, 256-bit) — the same sums, fused. Each
//! [`ByteDot`] has its own entry point carrying its target features; the bodies are shared.
//!
//! # Safety
//! Every `unsafe fn` here executes x86 SIMD instructions: call it only on a CPU with the
//! features its `#[target_feature]` entry point enables (a `KernelSet` of a tier hands these
//! out only after `Tier::is_supported`). Slices are read within their bounds; raw pointers
//! point into blocks the caller passed, at offsets the block layout defines.

use super::x86::{bcast4, fifth, Avx512Vnni, AvxVnni, ByteDot, Flavour, Maddubs, PREFETCH};
use crate::packed::{group_layout, GroupLayout, Rows8Fn, GROUP_ROWS};
use crate::quant::BlockQ8;
use crate::QuantType;
use std::arch::x86_64::*;

/// One packable format as the interleaved kernels see it.
pub(super) trait X8 {
    const TY: QuantType;
    /// Subtracted from every quant (Q4_0: 8, Q5_0: 16): taken out as `OFFSET * sum(y)`.
    const OFFSET: i32;
    /// Adds the group's eight integer dot products with each token's block `y[t]` to `acc[t]`.
    unsafe fn idot<D: ByteDot, const T: usize>(
        grp: *const u8,
        l: &GroupLayout,
        y: [*const i8; T],
        acc: &mut [__m256i; T],
    );
}

/// 4- and 5-bit formats: four loads of nibbles, each the low group `j` and high group `4 + j`.
#[inline(always)]
unsafe fn idot_nibbles<D: ByteDot, const T: usize, const FIVE: bool>(
    grp: *const u8,
    l: &GroupLayout,
    y: [*const i8; T],
    acc: &mut [__m256i; T],
) {
    let low4 = _mm256_set1_epi8(0x0F);
    let h = if FIVE {
        _mm256_loadu_si256(grp.add(l.qh.unwrap_or(0)) as *const __m256i)
    } else {
        _mm256_setzero_si256()
    };
    for j in 0..4 {
        let v = _mm256_loadu_si256(grp.add(l.qs + 32 * j) as *const __m256i);
        let mut lo = _mm256_and_si256(v, low4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        if FIVE {
            lo = _mm256_or_si256(lo, fifth(h, j as i32));
            hi = _mm256_or_si256(hi, fifth(h, 4 + j as i32));
        }
        for t in 0..T {
            acc[t] = D::udot2(
                acc[t],
                lo,
                bcast4(y[t], 4 * j),
                hi,
                bcast4(y[t], 16 + 4 * j),
            );
        }
    }
}

macro_rules! x8_nibbles {
    ($block:ident, $ty:ident, $offset:expr, $five:expr) => {
        impl X8 for crate::quant::$block {
            const TY: QuantType = QuantType::$ty;
            const OFFSET: i32 = $offset;
            #[inline(always)]
            unsafe fn idot<D: ByteDot, const T: usize>(
                grp: *const u8,
                l: &GroupLayout,
                y: [*const i8; T],
                acc: &mut [__m256i; T],
            ) {
                idot_nibbles::<D, T, $five>(grp, l, y, acc)
            }
        }
    };
}
x8_nibbles!(BlockQ4_0, Q4_0, 8, false);
x8_nibbles!(BlockQ4_1, Q4_1, 0, false);
x8_nibbles!(BlockQ5_0, Q5_0, 16, true);
x8_nibbles!(BlockQ5_1, Q5_1, 0, true);

impl X8 for crate::quant::BlockQ8_0 {
    const TY: QuantType = QuantType::Q8_0;
    const OFFSET: i32 = 0;
    /// Signed weights: |w| times the activations with w's sign (activations are never -128).
    #[inline(always)]
    unsafe fn idot<D: ByteDot, const T: usize>(
        grp: *const u8,
        l: &GroupLayout,
        y: [*const i8; T],
        acc: &mut [__m256i; T],
    ) {
        for j in 0..8 {
            let w = _mm256_loadu_si256(grp.add(l.qs + 32 * j) as *const __m256i);
            let aw = _mm256_abs_epi8(w);
            for t in 0..T {
                acc[t] = D::udot(acc[t], aw, _mm256_sign_epi8(bcast4(y[t], 4 * j), w));
            }
        }
    }
}

/// One group row against `T` tokens: lanes of `out[t]` are the eight rows' dot products.
#[inline(always)]
unsafe fn rows8_body<G: X8, D: ByteDot, const T: usize>(
    groups: &[u8],
    x: [&[BlockQ8]; T],
    sums: [&[i32]; T],
) -> [__m256; T] {
    let l = group_layout(G::TY).expect("packable type");
    let nb = groups.len() / l.bytes;
    for t in 0..T {
        assert!(x[t].len() >= nb && (G::OFFSET == 0 || sums[t].len() >= nb));
    }
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        let grp = groups.as_ptr().add(b * l.bytes);
        // Weights stream from DRAM in decode: ask for every line of the group PREFETCH bytes
        // ahead (past the end is harmless).
        let mut line = 0;
        while line < l.bytes {
            _mm_prefetch::<_MM_HINT_T0>(grp.wrapping_add(PREFETCH + line) as *const i8);
            line += 64;
        }
        let y: [*const i8; T] = std::array::from_fn(|t| x[t].get_unchecked(b).qs.as_ptr());
        let mut isum = [_mm256_setzero_si256(); T];
        G::idot::<D, T>(grp, &l, y, &mut isum);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(grp as *const __m128i));
        let mw = l
            .min
            .map(|at| _mm256_cvtph_ps(_mm_loadu_si128(grp.add(at) as *const __m128i)));
        for t in 0..T {
            let xb = x[t].get_unchecked(b);
            let mut i = isum[t];
            if G::OFFSET != 0 {
                i = _mm256_sub_epi32(i, _mm256_set1_epi32(G::OFFSET * *sums[t].get_unchecked(b)));
            }
            // `crate::quant::term`'s steps, lane by lane: the reference's rounding.
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(xb.d));
            let mut term = _mm256_mul_ps(d, _mm256_cvtepi32_ps(i));
            if let Some(mw) = mw {
                term = _mm256_add_ps(term, _mm256_mul_ps(mw, _mm256_set1_ps(xb.s)));
            }
            acc[t] = _mm256_add_ps(acc[t], term);
        }
    }
    acc
}

/// Runs the body for the `n` tokens given (1..=4) and stores the lanes.
#[inline(always)]
unsafe fn rows8_n<G: X8, D: ByteDot>(
    g: &[u8],
    x: [&[BlockQ8]; 4],
    s: [&[i32]; 4],
    n: usize,
    out: &mut [[f32; GROUP_ROWS]; 4],
) {
    macro_rules! run {
        ($t:literal) => {{
            let acc = rows8_body::<G, D, $t>(
                g,
                std::array::from_fn(|i| x[i]),
                std::array::from_fn(|i| s[i]),
            );
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

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows8_avx2<G: X8>(
    g: &[u8],
    x: [&[BlockQ8]; 4],
    s: [&[i32]; 4],
    n: usize,
    out: &mut [[f32; GROUP_ROWS]; 4],
) {
    rows8_n::<G, Maddubs>(g, x, s, n, out)
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn rows8_avxvnni<G: X8>(
    g: &[u8],
    x: [&[BlockQ8]; 4],
    s: [&[i32]; 4],
    n: usize,
    out: &mut [[f32; GROUP_ROWS]; 4],
) {
    rows8_n::<G, AvxVnni>(g, x, s, n, out)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn rows8_avx512vnni<G: X8>(
    g: &[u8],
    x: [&[BlockQ8]; 4],
    s: [&[i32]; 4],
    n: usize,
    out: &mut [[f32; GROUP_ROWS]; 4],
) {
    rows8_n::<G, Avx512Vnni>(g, x, s, n, out)
}

/// The interleaved kernel of block type `G` for `flavour` (the caller checked the CPU).
pub(super) fn rows8<G: X8>(flavour: Flavour) -> Rows8Fn {
    match flavour {
        Flavour::Avx2 => |g, x, s, n, out| unsafe { rows8_avx2::<G>(g, x, s, n, out) },
        Flavour::AvxVnni => |g, x, s, n, out| unsafe { rows8_avxvnni::<G>(g, x, s, n, out) },
        Flavour::Avx512Vnni => |g, x, s, n, out| unsafe { rows8_avx512vnni::<G>(g, x, s, n, out) },
    }
}
