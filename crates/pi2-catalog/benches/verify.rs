//! Verifying a model file: hashing it whole, against finding its remembered stamp.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::io::Write;

fn verify(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.gguf");
    let mut f = std::fs::File::create(&file).unwrap();
    let block: Vec<u8> = (0..1 << 20).map(|i| (i * 31 % 251) as u8).collect();
    for _ in 0..32 {
        f.write_all(&block).unwrap();
    }
    drop(f);
    let stamps = dir.path().join("stamps.json");
    let mut g = c.benchmark_group("verify");
    g.throughput(Throughput::Bytes(32 << 20));
    g.sample_size(10);
    g.bench_function("sha256_file_32MiB", |b| {
        b.iter(|| pi2_catalog::sha256_file(&file).unwrap())
    });
    pi2_catalog::sha256_stamped(&file, &stamps).unwrap();
    g.bench_function("sha256_stamped_remembered_32MiB", |b| {
        b.iter(|| pi2_catalog::sha256_stamped(&file, &stamps).unwrap())
    });
    g.finish();
}

criterion_group!(benches, verify);
criterion_main!(benches);
