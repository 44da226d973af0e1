//! Profile summarising cost: hit-rate curves (stack distances) on a synthetic skewed trace.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pi2_sparse::{hit_rates, Trace};

fn bench_hit_rates(c: &mut Criterion) {
    let (n, tokens) = (1536, 512);
    let mut trace = Trace::new(1, n, tokens);
    let mut counts = vec![0u64; n];
    let mut rng = 7u64;
    for t in 0..tokens {
        for (i, count) in counts.iter_mut().enumerate() {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if ((rng >> 33) % 1000) < (900 * 64 / (i as u64 + 64)).max(50) {
                trace.set(0, t, i);
                *count += 1;
            }
        }
    }
    let accesses: u64 = counts.iter().sum();
    let mut g = c.benchmark_group("hit_rates");
    g.throughput(Throughput::Elements(accesses));
    g.sample_size(10);
    g.bench_function("1536_neurons_512_tokens", |b| {
        b.iter(|| hit_rates(&trace, 0, &counts, &[0.1, 0.25, 0.5, 1.0], &[0.0, 0.1, 0.2]))
    });
    g.finish();
}

criterion_group!(benches, bench_hit_rates);
criterion_main!(benches);
