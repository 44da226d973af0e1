//! Every SIMD tier against the scalar reference, per format, on random blocks and activations:
//! bit for bit, because every tier computes the one function the reference defines (exact
//! integer sums per block, `quant::term`'s float steps, `quant::float_order`), so a file gives
//! the same answer on every CPU. A tier the CPU lacks is skipped for that CPU (the aarch64 tiers
//! run under qemu in CI).

use pi2_kernels::{axpy_rows, dot_row, ActBuf, KernelSet, MatRef, QuantType, Tier};
use proptest::prelude::*;

/// The same f32, bit for bit (NaN payloads aside, which these inputs never make).
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits()
}

/// A row of `blocks` random blocks of `ty` with finite, moderate f16 scales.
fn row_bytes(ty: QuantType, blocks: usize, seed: &[u8]) -> Vec<u8> {
    let n = ty.block_bytes() * blocks;
    let mut b: Vec<u8> = (0..n)
        .map(|i| seed[i % seed.len()].wrapping_add((i * 131 / seed.len()) as u8))
        .collect();
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let scale = |i: usize| f16(0.001 + (seed[i % seed.len()] as f32) / 2000.0);
    match ty {
        QuantType::F32 => {
            for (i, c) in b.chunks_exact_mut(4).enumerate() {
                c.copy_from_slice(&((seed[i % seed.len()] as f32 - 128.0) / 64.0).to_le_bytes());
            }
        }
        QuantType::F16 => {
            for (i, c) in b.chunks_exact_mut(2).enumerate() {
                c.copy_from_slice(&f16((seed[i % seed.len()] as f32 - 128.0) / 64.0));
            }
        }
        QuantType::BF16 => {
            for (i, c) in b.chunks_exact_mut(2).enumerate() {
                let v = (seed[i % seed.len()] as f32 - 128.0) / 64.0 * (1.0 + i as f32 / 97.0);
                c.copy_from_slice(&pi2_kernels::quant::bf16::f32_to_bf16(v).to_le_bytes());
            }
        }
        QuantType::Q6_K => {
            for (i, c) in b.chunks_exact_mut(210).enumerate() {
                c[208..].copy_from_slice(&scale(i));
            }
        }
        QuantType::Q2_K => {
            for (i, c) in b.chunks_exact_mut(84).enumerate() {
                c[80..82].copy_from_slice(&scale(i));
                c[82..84].copy_from_slice(&scale(i + 1));
            }
        }
        QuantType::Q3_K => {
            for (i, c) in b.chunks_exact_mut(110).enumerate() {
                c[108..].copy_from_slice(&scale(i));
            }
        }
        QuantType::MXFP4 => {
            // Scales from 2^-4 to 2^3: finite products.
            for (i, c) in b.chunks_exact_mut(17).enumerate() {
                c[0] = 124 + (seed[i % seed.len()] % 8);
            }
        }
        QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4_K | QuantType::Q5_K => {
            for (i, c) in b.chunks_exact_mut(ty.block_bytes()).enumerate() {
                c[..2].copy_from_slice(&scale(i));
                c[2..4].copy_from_slice(&scale(i + 1));
            }
        }
        QuantType::Q4_0
        | QuantType::Q5_0
        | QuantType::Q8_0
        | QuantType::IQ4_NL
        | QuantType::IQ4_XS => {
            for (i, c) in b.chunks_exact_mut(ty.block_bytes()).enumerate() {
                c[..2].copy_from_slice(&scale(i));
            }
        }
    }
    b
}

fn check(ty: QuantType, blocks: usize, seed: Vec<u8>, x: Vec<f32>) -> Result<(), TestCaseError> {
    let cols = ty.block_len() * blocks;
    let x: Vec<f32> = x.iter().cycle().take(cols).copied().collect();
    let row = row_bytes(ty, blocks, &seed);
    let mut acts = ActBuf::new();
    acts.quantize(ty.act_kind(), &x, cols);
    let scalar = KernelSet::scalar();
    let want = dot_row(&scalar, ty, &row, acts.row(0));
    for tier in Tier::ALL {
        let Some(ks) = KernelSet::for_tier(tier) else {
            continue;
        };
        let got = dot_row(&ks, ty, &row, acts.row(0));
        prop_assert!(
            same(got, want),
            "{ty} {tier:?}: got {got}, reference {want}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_tier_matches_reference(
        ty_i in 0usize..QuantType::ALL.len(),
        blocks in 1usize..12,
        seed in proptest::collection::vec(any::<u8>(), 1..64),
        x in proptest::collection::vec(-8.0f32..8.0, 1..300),
    ) {
        let ty = QuantType::ALL[ty_i];
        // keep float rows long enough to exercise the vector body and the tail
        let blocks = if ty.block_len() == 1 { blocks * 37 } else { blocks };
        check(ty, blocks, seed, x)?;
    }
}

proptest! {
    #[test]
    fn axpy_bf16_every_tier_matches_reference(
        a in -4.0f32..4.0,
        x in proptest::collection::vec(-100.0f32..100.0, 0..100),
    ) {
        let xh: Vec<u16> = x.iter().map(|&v| pi2_kernels::quant::bf16::f32_to_bf16(v)).collect();
        let y0: Vec<f32> = (0..x.len()).map(|i| i as f32 * 0.5 - 3.0).collect();
        let mut want = y0.clone();
        (KernelSet::scalar().axpy_bf16)(a, &xh, &mut want);
        for tier in Tier::ALL {
            let Some(ks) = KernelSet::for_tier(tier) else { continue };
            let mut got = y0.clone();
            (ks.axpy_bf16)(a, &xh, &mut got);
            for (g, w) in got.iter().zip(&want) {
                prop_assert!(same(*g, *w), "{tier:?}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn axpy_f16_every_tier_matches_reference(
        a in -4.0f32..4.0,
        x in proptest::collection::vec(-100.0f32..100.0, 0..100),
    ) {
        let xh: Vec<u16> = x.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
        let y0: Vec<f32> = (0..x.len()).map(|i| i as f32 * 0.5 - 3.0).collect();
        let mut want = y0.clone();
        (KernelSet::scalar().axpy_f16)(a, &xh, &mut want);
        for tier in Tier::ALL {
            let Some(ks) = KernelSet::for_tier(tier) else { continue };
            let mut got = y0.clone();
            (ks.axpy_f16)(a, &xh, &mut got);
            for (g, w) in got.iter().zip(&want) {
                prop_assert!(same(*g, *w), "{tier:?}: {g} vs {w}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// `y += a_i * row_i` over several rows (the sparse down projection) on every tier.
    #[test]
    fn axpy_rows_every_tier_matches_reference(
        ty_i in 0usize..QuantType::ALL.len(),
        blocks in 1usize..6,
        seed in proptest::collection::vec(any::<u8>(), 1..64),
        coeff in proptest::collection::vec(-3.0f32..3.0, 1..5),
    ) {
        let ty = QuantType::ALL[ty_i];
        let blocks = if ty.block_len() == 1 { blocks * 37 } else { blocks };
        let cols = ty.block_len() * blocks;
        let n = coeff.len();
        let mut bytes = Vec::new();
        for r in 0..n {
            let s: Vec<u8> = seed.iter().map(|b| b.wrapping_add(r as u8 * 17)).collect();
            bytes.extend(row_bytes(ty, blocks, &s));
        }
        // MatRef wants the type's alignment: copy into an 8-aligned buffer.
        let mut buf = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut buf)[..bytes.len()].copy_from_slice(&bytes);
        let data = &bytemuck::cast_slice::<u64, u8>(&buf)[..bytes.len()];
        let w = MatRef::new(ty, n, cols, data).unwrap();
        let rows: Vec<u32> = (0..n as u32).rev().collect();
        let y0: Vec<f32> = (0..cols).map(|i| (i % 7) as f32 - 3.0).collect();
        let mut want = y0.clone();
        axpy_rows(&KernelSet::scalar(), &w, &rows, &coeff, &mut want);
        for tier in Tier::ALL {
            let Some(ks) = KernelSet::for_tier(tier) else { continue };
            let mut got = y0.clone();
            axpy_rows(&ks, &w, &rows, &coeff, &mut got);
            for i in 0..cols {
                prop_assert!(
                    same(got[i], want[i]),
                    "{ty} {tier:?} [{i}]: {} vs {}", got[i], want[i]
                );
            }
        }
    }
}

/// The property tests above compare every supported tier; make sure that includes a SIMD one
/// on the architectures pi2 ships SIMD for.
#[test]
fn a_simd_tier_is_under_test() {
    let simd: Vec<Tier> = Tier::ALL
        .into_iter()
        .filter(|&t| t != Tier::Scalar && KernelSet::for_tier(t).is_some())
        .collect();
    let skipped: Vec<Tier> = Tier::ALL
        .into_iter()
        .filter(|&t| KernelSet::for_tier(t).is_none())
        .collect();
    eprintln!("SIMD tiers under test: {simd:?}");
    // The memchr way: a tier this CPU lacks is not run here, and the output says so.
    eprintln!(
        "tiers skipped (this CPU lacks them; CI runs them where the CPU has them): {skipped:?}"
    );
    if cfg!(target_arch = "aarch64") {
        assert!(simd.contains(&Tier::Neon));
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        assert!(simd.contains(&Tier::Avx2));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// 5 rows x 3 tokens runs the 4x2 tile, the 4-row kernel (odd token) and the single-row
    /// kernel (fifth row) of every tier; each output must match the scalar reference.
    #[test]
    fn matmul_tiles_match_reference(
        ty_i in 0usize..QuantType::ALL.len(),
        blocks in 1usize..6,
        seed in proptest::collection::vec(any::<u8>(), 1..64),
        x in proptest::collection::vec(-8.0f32..8.0, 1..200),
    ) {
        let ty = QuantType::ALL[ty_i];
        let blocks = if ty.block_len() == 1 { blocks * 37 } else { blocks };
        let cols = ty.block_len() * blocks;
        let (rows, n) = (5, 3);
        let mut bytes = Vec::new();
        for r in 0..rows {
            let mut s = seed.clone();
            s.push(r as u8);
            bytes.extend(row_bytes(ty, blocks, &s));
        }
        let w = pi2_kernels::MatRef::new(ty, rows, cols, &bytes).unwrap();
        let xs: Vec<f32> = x.iter().cycle().take(n * cols).enumerate().map(|(i, v)| v * (1.0 + (i % 7) as f32 / 7.0)).collect();
        let mut acts = ActBuf::new();
        acts.quantize(ty.act_kind(), &xs, cols);
        let scalar = KernelSet::scalar();
        for tier in Tier::ALL {
            let Some(ks) = KernelSet::for_tier(tier) else { continue };
            let mut out = vec![0.0; n * rows];
            pi2_kernels::matmul(&ks, &w, &acts, &mut out);
            // Every token row equals its one-row product bit for bit.
            for t in 0..n {
                let mut one = ActBuf::new();
                one.quantize(ty.act_kind(), &xs[t * cols..(t + 1) * cols], cols);
                let mut single = vec![0.0; rows];
                pi2_kernels::matmul(&ks, &w, &one, &mut single);
                prop_assert!(single[..] == out[t * rows..(t + 1) * rows], "{ty} {tier:?} token {t}: a batch row differs from the row alone");
            }
            for t in 0..n {
                for r in 0..rows {
                    let want = dot_row(&scalar, ty, w.row(r), acts.row(t));
                    let got = out[t * rows + r];
                    prop_assert!(same(got, want), "{ty} {tier:?} row {r} token {t}: {got} vs {want}");
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Row-interleaved copies (`PackedMat`): matmul on every tier equals the scalar reference on
    /// the original rows, for row counts that leave a partial last group and 1-6 tokens (the
    /// 4-token kernel plus a remainder).
    #[test]
    fn packed_matmul_matches_row_reference(
        ty_i in 0usize..8,
        rows in 1usize..21,
        blocks in 1usize..5,
        n in 1usize..7,
        seed in proptest::collection::vec(any::<u8>(), 1..64),
        x in proptest::collection::vec(-8.0f32..8.0, 1..200),
    ) {
        let ty = [
            QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_0, QuantType::Q5_1, QuantType::Q8_0,
            QuantType::Q4_K, QuantType::Q5_K, QuantType::Q6_K,
        ][ty_i];
        let cols = ty.block_len() * blocks;
        let mut bytes = Vec::new();
        for r in 0..rows {
            let mut s = seed.clone();
            s.push(r as u8);
            bytes.extend(row_bytes(ty, blocks, &s));
        }
        let w = MatRef::new(ty, rows, cols, &bytes).unwrap();
        let packed = pi2_kernels::PackedMat::pack(&w).unwrap();
        let xs: Vec<f32> = x.iter().cycle().take(n * cols).enumerate().map(|(i, v)| v * (1.0 + (i % 5) as f32 / 5.0)).collect();
        let mut acts = ActBuf::new();
        acts.quantize(ty.act_kind(), &xs, cols);
        let scalar = KernelSet::scalar();
        for tier in Tier::ALL {
            let Some(ks) = KernelSet::for_tier(tier) else { continue };
            let mut out = vec![0.0; n * rows];
            pi2_kernels::matmul(&ks, &packed.mat(), &acts, &mut out);
            for t in 0..n {
                for r in 0..rows {
                    let want = dot_row(&scalar, ty, w.row(r), acts.row(t));
                    let got = out[t * rows + r];
                    prop_assert!(same(got, want), "{ty} {tier:?} row {r} token {t}: {got} vs {want}");
                }
            }
        }
    }
}
