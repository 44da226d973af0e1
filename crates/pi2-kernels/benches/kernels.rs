//! Row dot-product and matmul throughput per format and tier (bytes/s of weights read).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pi2_kernels::{matmul, ActBuf, KernelSet, MatRef, PackedMat, QuantType, Tier};

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) as u8
        })
        .collect()
}

/// Random blocks with small finite f16 scales (random bytes could make NaN/inf scales).
fn matrix_bytes(ty: QuantType, rows: usize, cols: usize) -> Vec<u8> {
    let mut b = random_bytes(ty.row_bytes(cols).unwrap() * rows, 7);
    if ty != QuantType::F32 {
        let scale = 0x2C00u16.to_le_bytes(); // 1/16 as f16
        match ty {
            QuantType::F16 => b
                .chunks_exact_mut(2)
                .for_each(|c| c.copy_from_slice(&scale)),
            // 1/16 as BF16.
            QuantType::BF16 => b
                .chunks_exact_mut(2)
                .for_each(|c| c.copy_from_slice(&0x3D80u16.to_le_bytes())),
            QuantType::Q6_K => b
                .chunks_exact_mut(210)
                .for_each(|c| c[208..].copy_from_slice(&scale)),
            QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4_K | QuantType::Q5_K => {
                b.chunks_exact_mut(ty.block_bytes()).for_each(|c| {
                    c[..2].copy_from_slice(&scale);
                    c[2..4].copy_from_slice(&scale);
                })
            }
            _ => b
                .chunks_exact_mut(ty.block_bytes())
                .for_each(|c| c[..2].copy_from_slice(&scale)),
        }
    } else {
        b.chunks_exact_mut(4)
            .for_each(|c| c.copy_from_slice(&0.5f32.to_le_bytes()));
    }
    b
}

/// One group: `rows x cols` matrices of each type times `n` tokens, on every supported tier, one
/// thread. Throughput in weight bytes (matvec) or output elements (gemm).
fn bench_matmul(
    c: &mut Criterion,
    group: &str,
    types: &[QuantType],
    (rows, cols, n): (usize, usize, usize),
    bytes_throughput: bool,
) {
    let mut g = c.benchmark_group(group);
    if rows * cols > 1 << 24 {
        g.sample_size(10);
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for &ty in types {
        let bytes = matrix_bytes(ty, rows, cols);
        let w = MatRef::new(ty, rows, cols, &bytes).unwrap();
        let x: Vec<f32> = (0..cols * n).map(|i| (i as f32 * 0.01).sin()).collect();
        let mut acts = ActBuf::new();
        acts.quantize(ty.act_kind(), &x, cols);
        let mut out = vec![0.0; rows * n];
        g.throughput(if bytes_throughput {
            Throughput::Bytes(bytes.len() as u64)
        } else {
            Throughput::Elements((rows * n) as u64)
        });
        let packed = PackedMat::pack(&w);
        for tier in Tier::ALL {
            let Some(ks) = KernelSet::for_tier(tier) else {
                continue;
            };
            g.bench_with_input(
                BenchmarkId::new(format!("{ty}"), tier.name()),
                &ks,
                |b, ks| b.iter(|| pool.install(|| matmul(ks, &w, &acts, &mut out))),
            );
            // The row-interleaved copy (`PackedMat`) of the same matrix.
            if let Some(p) = &packed {
                let pm = p.mat();
                g.bench_with_input(
                    BenchmarkId::new(format!("{ty}-x8"), tier.name()),
                    &ks,
                    |b, ks| b.iter(|| pool.install(|| matmul(ks, &pm, &acts, &mut out))),
                );
            }
        }
    }
    g.finish();
}

/// Matvec that fits in cache, every format.
fn bench_matvec(c: &mut Criterion) {
    bench_matmul(
        c,
        "matvec_1536x1024",
        &QuantType::ALL,
        (1536, 1024, 1),
        true,
    );
}

/// Plain read bandwidth over a buffer larger than the last-level cache: the ceiling for
/// memory-bound matvec.
fn bench_memory(c: &mut Criterion) {
    let buf: Vec<u64> = (0..(96usize << 20) / 8).map(|i| i as u64).collect();
    let mut g = c.benchmark_group("memory");
    g.throughput(Throughput::Bytes((buf.len() * 8) as u64));
    g.sample_size(10);
    g.bench_function("read_96MiB", |b| {
        // 32 independent lanes (four 256-bit or eight 128-bit accumulators once vectorized), so
        // the loop is bound by memory, not by an add chain.
        b.iter(|| {
            let mut s = [0u64; 32];
            for ch in buf.chunks_exact(32) {
                for i in 0..32 {
                    s[i] = s[i].wrapping_add(ch[i]);
                }
            }
            s.iter().fold(0u64, |a, &x| a.wrapping_add(x))
        })
    });
    g.finish();
}

/// Matvec over a matrix larger than the last-level cache (memory-bound, the decode regime).
fn bench_matvec_large(c: &mut Criterion) {
    let types = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q8_0,
        QuantType::Q4_K,
        QuantType::Q6_K,
    ];
    bench_matmul(c, "matvec_65536x1024", &types, (65536, 1024, 1), true);
}

/// Prefill shape: 64 tokens through one matrix (rows x tokens tiles).
fn bench_gemm(c: &mut Criterion) {
    let types = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q8_0,
        QuantType::Q4_K,
        QuantType::Q6_K,
    ];
    bench_matmul(c, "gemm_1536x512x64", &types, (1536, 512, 64), false);
}

criterion_group!(
    benches,
    bench_memory,
    bench_matvec_large,
    bench_matvec,
    bench_gemm
);
criterion_main!(benches);
