//! What the x86 kernel modules share: the byte-product flavours ([`ByteDot`]: `maddubs` on
//! AVX2, `vpdpbusd` on the VNNI tiers), small register helpers, and the prefetch distance.
//!
//! # Safety
//! Every `unsafe fn` here executes x86 SIMD instructions: call it only from a kernel whose
//! `#[target_feature]` entry point enables what it uses (a `KernelSet` of a tier hands those
//! out only after `Tier::is_supported`). Raw pointers point into blocks the caller passed, at
//! offsets the block layout defines.

use std::arch::x86_64::*;

/// Prefetch distance for weight streams (bytes).
pub(super) const PREFETCH: usize = 2048;

#[inline(always)]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The sum of the eight i32 lanes (exact).
#[inline(always)]
pub(super) unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Lane `k` is the sum of the eight i32 lanes of `v[k]` (exact).
#[inline(always)]
pub(super) unsafe fn hsums4(v: [__m256i; 4]) -> __m128i {
    let a = _mm256_hadd_epi32(v[0], v[1]);
    let b = _mm256_hadd_epi32(v[2], v[3]);
    let c = _mm256_hadd_epi32(a, b);
    _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1))
}

/// f16 -> f32 through F16C. Written as `vmovd` + `vcvtph2ps` in asm because LLVM otherwise
/// loads the bits with `vpinsrw` into a register holding a live accumulator, a false dependency
/// that chains every loop iteration to the previous one (measured: 2.5x slower Q4_1 matvec).
#[inline(always)]
pub(super) unsafe fn f16_scalar(bits: u16) -> f32 {
    let v: __m128;
    std::arch::asm!(
        "vmovd {v}, {b:e}",
        "vcvtph2ps {v}, {v}",
        b = in(reg) bits as u32,
        v = out(xmm_reg) v,
        options(pure, nomem, nostack, preserves_flags),
    );
    _mm_cvtss_f32(v)
}

/// Eight lanes of `acc + sum(u_i * s_i)` over each lane's four byte pairs (`u` unsigned, `s`
/// signed).
pub(super) trait ByteDot {
    unsafe fn udot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
    /// `acc + u1.s1 + u2.s2`; the caller guarantees each lane pair of the two products sums
    /// within i16 (weights below 64), which lets `maddubs` add them before widening.
    unsafe fn udot2(acc: __m256i, u1: __m256i, s1: __m256i, u2: __m256i, s2: __m256i) -> __m256i;
    /// Accumulates products that one scale multiplies later: i16 lane pairs for `maddubs`
    /// (the caller finishes before they can overflow), i32 lanes for VNNI.
    unsafe fn acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
    /// `isum + scale * acc`, `sc` holding each lane's scale in both of its i16 halves.
    unsafe fn finish(isum: __m256i, acc: __m256i, sc: __m256i) -> __m256i;
}

/// AVX2: `maddubs` (u8 x i8 -> i16 pairs) then `madd` with ones (-> i32).
pub(super) struct Maddubs;
impl ByteDot for Maddubs {
    #[inline(always)]
    unsafe fn udot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
        _mm256_add_epi32(acc, p)
    }
    #[inline(always)]
    unsafe fn udot2(acc: __m256i, u1: __m256i, s1: __m256i, u2: __m256i, s2: __m256i) -> __m256i {
        let p = _mm256_add_epi16(_mm256_maddubs_epi16(u1, s1), _mm256_maddubs_epi16(u2, s2));
        _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
    }
    #[inline(always)]
    unsafe fn acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, s))
    }
    #[inline(always)]
    unsafe fn finish(isum: __m256i, acc: __m256i, sc: __m256i) -> __m256i {
        _mm256_add_epi32(isum, _mm256_madd_epi16(acc, sc))
    }
}

/// AVX-VNNI (VEX-encoded `vpdpbusd`, e.g. Alder Lake, Zen 5).
pub(super) struct AvxVnni;
impl ByteDot for AvxVnni {
    #[inline(always)]
    unsafe fn udot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, u, s)
    }
    #[inline(always)]
    unsafe fn udot2(acc: __m256i, u1: __m256i, s1: __m256i, u2: __m256i, s2: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, u1, s1), u2, s2)
    }
    #[inline(always)]
    unsafe fn acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, u, s)
    }
    #[inline(always)]
    unsafe fn finish(isum: __m256i, acc: __m256i, sc: __m256i) -> __m256i {
        _mm256_add_epi32(isum, _mm256_mullo_epi32(acc, _mm256_srai_epi32::<16>(sc)))
    }
}

/// AVX512-VNNI with VL (EVEX-encoded 256-bit `vpdpbusd`, e.g. Ice Lake, Zen 4).
pub(super) struct Avx512Vnni;
impl ByteDot for Avx512Vnni {
    #[inline(always)]
    unsafe fn udot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }
    #[inline(always)]
    unsafe fn udot2(acc: __m256i, u1: __m256i, s1: __m256i, u2: __m256i, s2: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(acc, u1, s1), u2, s2)
    }
    #[inline(always)]
    unsafe fn acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }
    #[inline(always)]
    unsafe fn finish(isum: __m256i, acc: __m256i, sc: __m256i) -> __m256i {
        _mm256_add_epi32(isum, _mm256_mullo_epi32(acc, _mm256_srai_epi32::<16>(sc)))
    }
}

/// Four activations (bytes `at..at + 4` of a block) in every lane.
#[inline(always)]
pub(super) unsafe fn bcast4(y: *const i8, at: usize) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(y.add(at) as *const i32))
}

/// 0x10 in every byte whose bit `k` is set in the packed `qh` vector: the fifth bits of
/// activation group `k` (see the layout in `crate::packed`).
#[inline(always)]
pub(super) unsafe fn fifth(h: __m256i, k: i32) -> __m256i {
    let moved = if k <= 4 {
        _mm256_sll_epi16(h, _mm_cvtsi32_si128(4 - k))
    } else {
        _mm256_srl_epi16(h, _mm_cvtsi32_si128(k - 4))
    };
    _mm256_and_si256(moved, _mm256_set1_epi8(0x10))
}

/// The byte-product flavour of a tier's interleaved kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Flavour {
    Avx2,
    AvxVnni,
    Avx512Vnni,
}

/// The 32 nibbles of a Q4 block as bytes: low nibbles (elements 0..16) then high (16..32).
#[inline(always)]
pub(super) unsafe fn nibbles(qs: &[u8; 16]) -> __m256i {
    let tmp = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// The IQ4_NL levels of a block's 32 indices, element order (one in-lane table lookup).
#[inline(always)]
pub(super) unsafe fn iq4nl_values(qs: &[u8; 16]) -> __m256i {
    table_values(&crate::quant::iq4_nl::IQ4NL_TABLE, qs)
}

/// The MXFP4 values (E2M1, doubled) of a block's 32 indices, element order.
#[inline(always)]
pub(super) unsafe fn mxfp4_values(qs: &[u8; 16]) -> __m256i {
    table_values(&crate::quant::mxfp4::MXFP4_TABLE, qs)
}

/// `table[q]` for a block's 32 4-bit indices, element order (one in-lane lookup).
#[inline(always)]
unsafe fn table_values(table: &[i8; 16], qs: &[u8; 16]) -> __m256i {
    let table = _mm_loadu_si128(table.as_ptr() as *const __m128i);
    _mm256_shuffle_epi8(_mm256_set_m128i(table, table), nibbles(qs))
}
